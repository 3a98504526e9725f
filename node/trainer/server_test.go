package trainer

import (
	"context"
	"crypto/rand"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/pspnode/pspnode/node"
	pb "github.com/pspnode/pspnode/node/trainer/trainerpb"
)

// Two daemons of a gossip job, each driven by a trainer: what one
// publishes, the other pulls, summed, exactly once; the steps advance
// together.
func TestTwoTrainersExchangeUpdates(t *testing.T) {
	for _, shm := range []bool{false, true} {
		t.Run(map[bool]string{false: "socket", true: "shared-memory"}[shm], func(t *testing.T) {
			if shm && !sharedMemorySupported {
				t.Skip("no shared memory on this system")
			}
			a := startDaemon(t, "pair", nil, "pssp:1:2", nil)
			b := startDaemon(t, "pair", a, "pssp:1:2", nil)
			peersKnow(t, a, b)
			const n = 1000
			ta, err := connectShm(t, a.addr, hello("m", 7, n, 0), shm)
			if err != nil {
				t.Fatal(err)
			}
			tb, err := connectShm(t, b.addr, hello("m", 7, n, 0), shm)
			if err != nil {
				t.Fatal(err)
			}
			if ta.welcome.UpdateKind != pb.UpdateKind_UPDATE_KIND_DELTA || ta.welcome.Exchange != "gossip" {
				t.Fatalf("welcome %v", ta.welcome)
			}
			if shm && (ta.welcome.ShmPath == "" || ta.shm == nil) {
				t.Fatalf("no shared file: %v", ta.welcome)
			}
			// a publishes 1s, b publishes 2s, for 20 steps each, in
			// parallel; each pulls what the other sent.
			const steps = 20
			got := make(chan [2]float64, 2)
			run := func(tr *trainer, x float32) {
				var sum float64
				var merged int
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				for s := int64(1); s <= steps; s++ {
					r, err := tr.stepShm(ctx, s, fill(n, x))
					if err != nil {
						t.Errorf("step %d: %v", s, err)
						got <- [2]float64{}
						return
					}
					if u := tr.pulled(r.Pull); u != nil {
						sum += float64(u[n/2])
						merged += int(r.Pull.Merged)
					}
				}
				// The last updates may still be on their way.
				deadline := time.Now().Add(10 * time.Second)
				for merged < steps && time.Now().Before(deadline) {
					r, err := tr.c.Pull(tr.with(ctx), &pb.PullRequest{})
					if err != nil {
						t.Error(err)
						break
					}
					if u := tr.pulled(r); u != nil {
						sum += float64(u[n/2])
						merged += int(r.Merged)
					}
				}
				got <- [2]float64{sum, float64(merged)}
			}
			go run(ta, 1)
			go run(tb, 2)
			r1, r2 := <-got, <-got
			// Which result is whose does not matter: one trainer pulled
			// 20 × 2 = 40, the other 20 × 1 = 20, each from 20 updates.
			sums := map[float64]bool{r1[0]: true, r2[0]: true}
			if !sums[20] || !sums[40] || r1[1] != steps || r2[1] != steps {
				t.Fatalf("pulled (sum, updates) %v and %v; want 20 and 40 from 20 updates each", r1, r2)
			}
			if a.node.Step() != steps || b.node.Step() != steps {
				t.Fatalf("steps %d, %d; want %d", a.node.Step(), b.node.Step(), steps)
			}
		})
	}
}

// What a trainer says about its model is checked, and one trainer at a
// time drives a daemon.
func TestHelloRefusals(t *testing.T) {
	a := startDaemon(t, "refuse", nil, "asp", nil)
	first, err := connect(t, a.addr, hello("mlp", 11, 100, 0), nil)
	if err != nil {
		t.Fatal(err)
	}
	const (
		badHello = pb.ErrorReason_ERROR_REASON_BAD_HELLO
	)
	cases := []struct {
		name   string
		hello  *pb.Hello
		code   codes.Code
		says   string
		reason pb.ErrorReason
		meta   map[string]string // ErrorInfo's metadata must hold these
	}{
		{"second trainer", hello("mlp", 11, 100, 0), codes.AlreadyExists, "already has a trainer",
			pb.ErrorReason_ERROR_REASON_TRAINER_CONNECTED, map[string]string{"connected_client": "go test"}},
		{"api version", func() *pb.Hello { h := hello("mlp", 11, 100, 0); h.ApiVersion = 9; return h }(), codes.InvalidArgument, "API version 9",
			pb.ErrorReason_ERROR_REASON_API_VERSION, map[string]string{"api_version": "9", "supported": "3"}},
		{"api version 1", func() *pb.Hello { h := hello("mlp", 11, 100, 0); h.ApiVersion = 1; return h }(), codes.InvalidArgument, "API version 1",
			pb.ErrorReason_ERROR_REASON_API_VERSION, nil},
		{"dtype", func() *pb.Hello { h := hello("mlp", 11, 100, 0); h.Dtype = 0; return h }(), codes.InvalidArgument, "float32",
			badHello, map[string]string{"field": "dtype"}},
		{"no params", hello("mlp", 11, 0, 0), codes.InvalidArgument, "num_params is 0", badHello, map[string]string{"field": "num_params"}},
		{"no model id", hello("mlp", 0, 100, 0), codes.InvalidArgument, "model_id is 0", badHello, map[string]string{"field": "model_id"}},
		{"too large", hello("mlp", 11, 1<<40, 0), codes.InvalidArgument, "at most 2³¹−1", badHello, map[string]string{"field": "num_params"}},
		{"too large for a message", hello("mlp", 11, (DefaultConfig().MaxMessageBytes-4096)/4+1, 0), codes.InvalidArgument,
			"start the daemon with --trainer-max-message", badHello, map[string]string{"field": "num_params", "max": strconv.Itoa((DefaultConfig().MaxMessageBytes - 4096) / 4)}},
		{"negative step", hello("mlp", 11, 100, -1), codes.InvalidArgument, "step -1", badHello, map[string]string{"field": "step"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := connect(t, a.addr, c.hello, nil)
			if status.Code(err) != c.code || !strings.Contains(status.Convert(err).Message(), c.says) {
				t.Fatalf("got %v; want %v saying %q", err, c.code, c.says)
			}
			checkInfo(t, err, c.reason, c.meta)
		})
	}
	// Once the first trainer is gone, a trainer of another model is
	// refused with a message that names both models.
	first.close()
	waitFor(t, 10*time.Second, "the first session to end", func() bool { return a.node.Status().Idle })
	_, err = connect(t, a.addr, hello("cnn", 12, 200, 0), nil)
	msg := status.Convert(err).Message()
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(msg, `"cnn"`) || !strings.Contains(msg, `"mlp"`) ||
		!strings.Contains(msg, "200") || !strings.Contains(msg, "100") {
		t.Fatalf("another model: %v", err)
	}
	checkInfo(t, err, pb.ErrorReason_ERROR_REASON_MODEL_MISMATCH, map[string]string{
		"model_name": "cnn", "model_id": "0x0000000c", "num_params": "200",
		"other_model_name": "mlp", "other_model_id": "0x0000000b", "other_num_params": "100"})
	// The same model again is welcome.
	if _, err := connect(t, a.addr, hello("mlp", 11, 100, 0), nil); err != nil {
		t.Fatalf("the same model again: %v", err)
	}
}

// A trainer whose model differs from the one its job runs is refused with
// a message naming the peer's model and its own.
func TestModelMismatchWithJob(t *testing.T) {
	a := startDaemon(t, "mismatch", nil, "asp", nil)
	b := startDaemon(t, "mismatch", a, "asp", nil)
	peersKnow(t, a, b)
	params := func() (int64, []float32) { return 3, fill(100, 0.5) }
	ta, err := connect(t, a.addr, hello("mlp", 11, 100, 0), params)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for s := int64(1); s <= 3; s++ {
		if _, err := ta.step(ctx, s, fill(100, 0.1)); err != nil {
			t.Fatal(err)
		}
	}
	_, err = connect(t, b.addr, hello("cnn", 12, 200, 0), nil)
	msg := status.Convert(err).Message()
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(msg, "model mismatch") ||
		!strings.Contains(msg, a.node.ID().String()) || !strings.Contains(msg, `"cnn"`) || !strings.Contains(msg, "0x0000000b") {
		t.Fatalf("got %v", err)
	}
	checkInfo(t, err, pb.ErrorReason_ERROR_REASON_MODEL_MISMATCH, map[string]string{
		"model_name": "cnn", "num_params": "200", "other_model_id": "0x0000000b", "other_num_params": "100",
		"peer": a.node.ID().String()})
	// The refused trainer was b's first: its model was not fixed, so the
	// job's model is welcome there.
	if _, err := connect(t, b.addr, hello("mlp", 11, 100, 0), nil); err != nil {
		t.Fatalf("the job's model, after another was refused: %v", err)
	}
}

// A joining trainer starts from the job's step and the parameters of a
// peer's trainer, which its daemon fetched through the peer's daemon.
func TestJoinerGetsJobModelFromPeerTrainer(t *testing.T) {
	a := startDaemon(t, "join", nil, "asp", nil)
	b := startDaemon(t, "join", a, "asp", nil)
	peersKnow(t, a, b)
	want := make([]float32, 50)
	for i := range want {
		want[i] = float32(i) / 7
	}
	ta, err := connect(t, a.addr, hello("m", 5, 50, 0), func() (int64, []float32) { return 12, want })
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for s := int64(1); s <= 12; s++ {
		if _, err := ta.step(ctx, s, fill(50, 0.01)); err != nil {
			t.Fatal(err)
		}
	}
	tb, err := connect(t, b.addr, hello("m", 5, 50, 0), nil)
	if err != nil {
		t.Fatal(err)
	}
	w := tb.welcome
	if w.Step != 12 || !w.HasParams || !strings.Contains(w.ParamsSource, a.node.ID().String()) {
		t.Fatalf("welcome: step %d, params %v from %q", w.Step, w.HasParams, w.ParamsSource)
	}
	got := f32s(w.Params.GetData())
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("param %d = %v, want %v", i, got[i], want[i])
		}
	}
	ta.mu.Lock()
	asked := ta.asked
	ta.mu.Unlock()
	if asked == 0 {
		t.Fatal("the peer's daemon did not ask its trainer for the parameters")
	}
}

// Bad input from a trainer gets a clear error, changes nothing, and the
// session goes on.
func TestBadCalls(t *testing.T) {
	a := startDaemon(t, "bad", nil, "asp", nil)
	tr, err := connect(t, a.addr, hello("m", 5, 10, 0), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	nan := fill(10, 0)
	nan[3] = float32(nanF())
	big := fill(10, 0)
	big[9] = 2e4
	cases := []struct {
		name   string
		call   func() error
		code   codes.Code
		says   string
		reason pb.ErrorReason
	}{
		{"nan", func() error { _, err := tr.step(ctx, 1, nan); return err }, codes.InvalidArgument, "value 3 is NaN", pb.ErrorReason_ERROR_REASON_BAD_VALUE},
		{"too big", func() error { _, err := tr.step(ctx, 1, big); return err }, codes.InvalidArgument, "value 9 is 20000, beyond", pb.ErrorReason_ERROR_REASON_BAD_VALUE},
		{"length", func() error { _, err := tr.step(ctx, 1, fill(9, 0)); return err }, codes.InvalidArgument, "36 bytes", pb.ErrorReason_ERROR_REASON_BAD_TENSOR},
		{"barrier ahead", func() error {
			_, err := tr.c.Barrier(tr.with(ctx), &pb.BarrierRequest{Step: 5})
			return err
		}, codes.OutOfRange, "the next barrier is for step 1", pb.ErrorReason_ERROR_REASON_STEP_ORDER},
		{"step ahead", func() error { _, err := tr.step(ctx, 3, fill(10, 0)); return err }, codes.OutOfRange, "the next is step 1", pb.ErrorReason_ERROR_REASON_STEP_ORDER},
		{"no session", func() error {
			_, err := tr.c.Pull(metadata.AppendToOutgoingContext(ctx, SessionKey, "nope"), &pb.PullRequest{})
			return err
		}, codes.FailedPrecondition, "no such session", pb.ErrorReason_ERROR_REASON_NO_SESSION},
		{"shared without shm", func() error {
			_, err := tr.c.Publish(tr.with(ctx), &pb.PublishRequest{Step: 1, Update: sharedTensor(0)})
			return err
		}, codes.InvalidArgument, "no shared file", pb.ErrorReason_ERROR_REASON_BAD_TENSOR},
		{"checkpoint without file", func() error {
			_, err := tr.c.Checkpoint(tr.with(ctx), &pb.CheckpointRequest{Step: 0, Params: dataTensor(f32bytes(fill(10, 0)))})
			return err
		}, codes.FailedPrecondition, "--checkpoint", pb.ErrorReason_ERROR_REASON_NO_CHECKPOINT},
		{"bad eval", func() error {
			_, err := tr.c.Publish(tr.with(ctx), &pb.PublishRequest{Step: 1, Update: dataTensor(f32bytes(fill(10, 0))), HasEval: true, Loss: 1, Accuracy: 3})
			return err
		}, codes.InvalidArgument, "accuracy", pb.ErrorReason_ERROR_REASON_BAD_EVALUATION},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.call()
			if status.Code(err) != c.code || !strings.Contains(status.Convert(err).Message(), c.says) {
				t.Fatalf("got %v; want %v saying %q", err, c.code, c.says)
			}
			if info := errorInfo(err); info == nil || info.Reason != ReasonOf(c.reason) || info.Domain != ErrorDomain {
				t.Fatalf("error details %v; want reason %s", info, ReasonOf(c.reason))
			}
			if a.node.Step() != 0 {
				t.Fatalf("the step moved to %d", a.node.Step())
			}
		})
	}
	// A publish before its barrier: step 1 is the session's first and
	// needs none; step 2 does.
	if _, err := tr.c.Publish(tr.with(ctx), &pb.PublishRequest{Step: 1, Update: dataTensor(f32bytes(fill(10, 0.5)))}); err != nil {
		t.Fatal(err)
	}
	_, err = tr.c.Publish(tr.with(ctx), &pb.PublishRequest{Step: 2, Update: dataTensor(f32bytes(fill(10, 0.5)))})
	if status.Code(err) != codes.OutOfRange || !strings.Contains(err.Error(), "call Barrier(2) first") {
		t.Fatalf("publish before its barrier: %v", err)
	}
	// The session still works.
	if _, err := tr.c.Barrier(tr.with(ctx), &pb.BarrierRequest{Step: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.step(ctx, 2, fill(10, 0.5)); err != nil {
		t.Fatal(err)
	}
	if a.node.Step() != 2 {
		t.Fatalf("step %d, want 2", a.node.Step())
	}
}

func nanF() float64 { var z float64; return z / z }

// errorInfo is the ErrorInfo in err's status details, nil for none.
func errorInfo(err error) *errdetails.ErrorInfo {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info
		}
	}
	return nil
}

// checkInfo fails unless err's ErrorInfo has reason, the trainer API's
// domain, and every entry of meta in its metadata.
func checkInfo(t *testing.T, err error, reason pb.ErrorReason, meta map[string]string) {
	t.Helper()
	info := errorInfo(err)
	if info == nil || info.Reason != ReasonOf(reason) || info.Domain != ErrorDomain {
		t.Fatalf("%v: error details %v; want reason %s in domain %s", err, info, ReasonOf(reason), ErrorDomain)
	}
	for k, v := range meta {
		if info.Metadata[k] != v {
			t.Errorf("ErrorInfo metadata[%q] = %q, want %q (all: %v)", k, info.Metadata[k], v, info.Metadata)
		}
	}
}

// A client of the API's version 1 is told to upgrade, with a reason.
func TestVersion1ClientTold(t *testing.T) {
	a := startDaemon(t, "v1", nil, "asp", nil)
	conn := dial(t, a.addr)
	for _, v := range []string{"1", "2"} {
		err := conn.Invoke(context.Background(), "/pspnode.trainer.v"+v+".Trainer/Status", &pb.StatusRequest{}, &pb.StatusReply{})
		if status.Code(err) != codes.Unimplemented || !strings.Contains(status.Convert(err).Message(), "version 3") {
			t.Fatalf("a version %s call: %v", v, err)
		}
		checkInfo(t, err, pb.ErrorReason_ERROR_REASON_API_VERSION, map[string]string{"api_version": v, "supported": "3"})
	}
	// Version 3's Status says what /status does, typed.
	st, err := pb.NewTrainerClient(conn).Status(context.Background(), &pb.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.Node == nil || !st.Node.Joined || !st.Node.Idle || len(st.Node.Addrs) == 0 || st.PeerId != a.node.ID().String() {
		t.Fatalf("status: %v", st)
	}
}

// A malformed or oversized message on the socket ends that call or
// connection, and the daemon goes on serving.
func TestMalformedInputOnSocket(t *testing.T) {
	a := startDaemon(t, "junk", nil, "asp", func(_ *node.Config, c *Config) { c.MaxMessageBytes = 2 << 20 })
	path := strings.TrimPrefix(a.addr, "unix:")
	for _, junk := range [][]byte{
		[]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
		append([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), make([]byte, 4096)...),
		{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
	} {
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = c.Write(junk)
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 1024)
		for {
			if _, err := c.Read(buf); err != nil {
				break // the daemon closed it (or the deadline passed)
			}
		}
		c.Close()
	}
	tr, err := connect(t, a.addr, hello("m", 5, 10, 0), nil)
	if err != nil {
		t.Fatalf("after junk: %v", err)
	}
	// A message over the cap is refused, and the session goes on.
	_, err = tr.c.Publish(tr.with(context.Background()), &pb.PublishRequest{Step: 1, Update: dataTensor(make([]byte, 3<<20))})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("oversized: %v", err)
	}
	if _, err := tr.step(context.Background(), 1, fill(10, 0.1)); err != nil {
		t.Fatalf("after an oversized message: %v", err)
	}
}

// When its trainer goes, a daemon leaves its peers' barriers at once:
// under a barrier that would hold a peer at the idle daemon's step, the
// peer goes on; a returning trainer starts from the job's step and model.
func TestTrainerGoneFreesPeers(t *testing.T) {
	// pSSP(1, 0) on two nodes: each waits for the other at every step.
	a := startDaemon(t, "gone", nil, "pssp:1:0", nil)
	b := startDaemon(t, "gone", a, "pssp:1:0", nil)
	peersKnow(t, a, b)
	const n = 20
	pa := fill(n, 1)
	ta, err := connect(t, a.addr, hello("m", 5, n, 0), func() (int64, []float32) { return a.node.Step(), pa })
	if err != nil {
		t.Fatal(err)
	}
	tb, err := connect(t, b.addr, hello("m", 5, n, 0), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Step together to 5: b steps in the background.
	go func() {
		for s := int64(1); s <= 5; s++ {
			if _, err := tb.step(ctx, s, fill(n, 0.1)); err != nil {
				return
			}
		}
	}()
	for s := int64(1); s <= 5; s++ {
		if _, err := ta.step(ctx, s, fill(n, 0.1)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 20*time.Second, "b at step 5", func() bool { return b.node.Step() >= 5 })
	// b's trainer goes. a must not wait for b: it takes ten more steps.
	tb.close()
	waitFor(t, 10*time.Second, "b idle", func() bool { return b.node.Status().Idle })
	// Waiting on b would hold a at step 6 until ctx's deadline; once a
	// has passed it, b no longer counts: every later barrier passes at
	// its first check (counted, not timed).
	var last *pb.StepReply
	for s := int64(6); s <= 15; s++ {
		r, err := ta.step(ctx, s, fill(n, 0.1))
		if err != nil {
			t.Fatalf("step %d with b idle: %v", s, err)
		}
		if s > 6 && r.Barrier.Reason != "" {
			t.Fatalf("step %d waited for an idle peer (%d checks): %s", s, r.Barrier.Checks, r.Barrier.Reason)
		}
		last = r
	}
	// The idle peer no longer counts in a's population: a is alone, and
	// scales its updates by 1, not 1/2.
	if last.Barrier.Population > 1.5 || last.Barrier.LrScale < 0.9 {
		t.Fatalf("with b idle, a's population is %.2f and its update scale %.2f", last.Barrier.Population, last.Barrier.LrScale)
	}
	// A new trainer on b starts from the job: a's step and parameters.
	tb2, err := connect(t, b.addr, hello("m", 5, n, 0), nil)
	if err != nil {
		t.Fatal(err)
	}
	if tb2.welcome.Step < 15 || !tb2.welcome.HasParams || f32s(tb2.welcome.Params.GetData())[0] != 1 {
		t.Fatalf("the returning trainer's welcome: step %d, params %v", tb2.welcome.Step, tb2.welcome.HasParams)
	}
}

// A trainer that connects before its daemon has joined hears why it
// waits, as /health says it, and is welcomed once the job is reachable.
func TestWaitingSaysWhy(t *testing.T) {
	// A bootstrap address where nothing listens yet.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	key, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := peer.IDFromPrivateKey(key)
	late := "/ip4/127.0.0.1/tcp/" + itoa(port) + "/p2p/" + id.String()
	d := startDaemon(t, "wait", nil, "asp", func(c *node.Config, _ *Config) {
		c.Bootstrap = []string{late}
		c.Overlay.Join.RetryMin, c.Overlay.Join.RetryMax = 50*time.Millisecond, 200*time.Millisecond
	})
	type result struct {
		tr  *trainer
		err error
	}
	res := make(chan result, 1)
	go func() {
		tr, err := connect(t, d.addr, hello("m", 5, 10, 0), nil)
		res <- result{tr, err}
	}()
	// The job comes up a moment later, on the address the daemon dials.
	waitFor(t, 10*time.Second, "the daemon to try its bootstrap", func() bool { return d.node.Status().JoinAttempts > 0 })
	first := startDaemon(t, "wait", nil, "asp", func(c *node.Config, _ *Config) {
		c.Identity = key
		c.Listen = []string{"/ip4/127.0.0.1/tcp/" + itoa(port)}
	})
	_ = first
	r := <-res
	if r.err != nil {
		t.Fatal(r.err)
	}
	if len(r.tr.waiting) == 0 || !strings.Contains(r.tr.waiting[0], "not joined") {
		t.Fatalf("waiting reasons %q", r.tr.waiting)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

// The daemon removes the shared files of daemons that are gone, and
// refuses a socket path another daemon listens on.
func TestStaleFiles(t *testing.T) {
	if !sharedMemorySupported {
		t.Skip("no shared memory on this system")
	}
	dir := t.TempDir()
	stale := dir + "/" + shmPrefix + "999999999-1"
	if err := os.WriteFile(stale, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	mine := dir + "/" + shmPrefix + itoa(os.Getpid()) + "-1"
	if err := os.WriteFile(mine, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if k := removeStaleShared(dir); k != 1 {
		t.Fatalf("removed %d, want 1", k)
	}
	if _, err := os.Stat(mine); err != nil {
		t.Fatal("removed a live daemon's file")
	}
	a := startDaemon(t, "sock", nil, "asp", nil)
	_, _, err := listen(a.addr)
	if err == nil || !strings.Contains(err.Error(), "another daemon listens") {
		t.Fatalf("second listener on one socket: %v", err)
	}
}

// Every psp_trainer_* family the server exports is listed in docs/cli.md,
// and every one listed there is exported.
func TestMetricsDocumented(t *testing.T) {
	exported := map[string]bool{}
	// Vectors without a series are not gathered: name the families from
	// the collectors' descriptions.
	descs := make(chan *prometheus.Desc, 64)
	mm, sm := newMetrics(nil), newStateMetrics(nil)
	for _, c := range []prometheus.Collector{mm.connected, mm.sessions, mm.refused, mm.calls, mm.errors, mm.refusedUpdates, mm.merged, mm.resets, mm.paramsRequests, sm.served, sm.fetched} {
		c.Describe(descs)
	}
	close(descs)
	for d := range descs {
		name := regexp.MustCompile(`fqName: "([a-z_]+)"`).FindStringSubmatch(d.String())
		if name != nil {
			exported[name[1]] = true
		}
	}
	doc, err := os.ReadFile("../../docs/cli.md")
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, n := range regexp.MustCompile(`\bpsp_trainer_[a-z_]*[a-z]`).FindAllString(string(doc), -1) {
		listed[n] = true
	}
	for n := range exported {
		if !listed[n] {
			t.Errorf("%s is not listed in docs/cli.md", n)
		}
	}
	for n := range listed {
		if !exported[n] {
			t.Errorf("docs/cli.md names %s, which the trainer API does not export", n)
		}
	}
	if len(exported) < 8 {
		t.Fatalf("found %d families", len(exported))
	}
}
