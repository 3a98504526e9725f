package trainer

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/pspnode/pspnode/internal/f32"
	"github.com/pspnode/pspnode/node"
	"github.com/pspnode/pspnode/node/exchange"
	pb "github.com/pspnode/pspnode/node/trainer/trainerpb"
	"github.com/pspnode/pspnode/psp"
)

// daemon is a driven node on loopback TCP with its trainer API on a Unix
// socket, as `pspnode run --trainer` makes one.
type daemon struct {
	node *node.Node
	srv  *Server
	addr string // the trainer API's
}

// startDaemon starts a daemon of job, joining through boot (nil: the
// first), with barrier, the gossip exchange unless edit sets another, and
// edit applied to its config.
func startDaemon(t testing.TB, job string, boot *daemon, barrier string, edit func(*node.Config, *Config)) *daemon {
	t.Helper()
	task := NewRemoteModel()
	cfg := node.DefaultLocalConfig()
	cfg.Job = job
	cfg.Barrier = psp.MustParse(barrier)
	cfg.Driven = true
	cfg.Check.QueryTimeout = time.Second
	cfg.Exchange.Spec = exchange.Spec{} // gossip: most tests here check its deltas
	if boot != nil {
		cfg.Bootstrap = []string{boot.node.Addrs()[0].String()}
	}
	tcfg := DefaultConfig()
	tcfg.Listen = "unix:" + filepath.Join(t.TempDir(), "trainer.sock")
	if edit != nil {
		edit(&cfg, &tcfg)
	}
	nd, err := node.New(context.Background(), cfg, node.WithModel(task))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(nd, task, tcfg)
	if err != nil {
		nd.Close()
		t.Fatal(err)
	}
	d := &daemon{node: nd, srv: srv, addr: srv.Addr()}
	t.Cleanup(func() {
		srv.Close()
		nd.Close()
	})
	return d
}

// trainer is a Go client of the trainer API, for tests: it keeps the
// session open and answers the daemon's parameter requests with params.
type trainer struct {
	t       testing.TB
	conn    *grpc.ClientConn
	c       pb.TrainerClient
	stream  pb.Trainer_SessionClient
	cancel  context.CancelFunc
	welcome *pb.Welcome
	waiting []string // the Waiting reasons seen before Welcome
	n       int

	shm []byte // the mapped shared file, nil without

	mu     sync.Mutex
	params func() (int64, []float32)
	state  func() *pb.TrainerState // answers ParamsRequest.want_state (state_test.go)
	asked  int
	stated int              // want_state requests answered
	chunks []*pb.StateChunk // StateChunk messages received after Welcome
	ended  chan struct{}
}

func dial(t testing.TB, addr string) *grpc.ClientConn {
	t.Helper()
	target := addr
	if len(addr) > 5 && addr[:5] == "unix:" {
		target = "unix://" + addr[5:]
	} else if len(addr) > 4 && addr[:4] == "tcp:" {
		target = addr[4:]
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20), grpc.MaxCallSendMsgSize(64<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// hello is a valid Hello for a model of n parameters.
func hello(name string, id uint32, n int, step int64) *pb.Hello {
	return &pb.Hello{ApiVersion: pb.ApiVersion_API_VERSION_3, ModelName: name, ModelId: id, NumParams: uint64(n),
		Dtype: pb.DType_DTYPE_FLOAT32, Step: step, Client: "go test"}
}

// connect opens a session with h; it returns the error the daemon ended
// the session with if it refused it.
func connect(t testing.TB, addr string, h *pb.Hello, params func() (int64, []float32)) (*trainer, error) {
	t.Helper()
	conn := dial(t, addr)
	ctx, cancel := context.WithCancel(context.Background())
	tr := &trainer{t: t, conn: conn, c: pb.NewTrainerClient(conn), cancel: cancel, params: params, n: int(h.NumParams), ended: make(chan struct{})}
	t.Cleanup(tr.close)
	stream, err := tr.c.Session(ctx)
	if err != nil {
		return nil, err
	}
	tr.stream = stream
	if err := stream.Send(&pb.TrainerMessage{Msg: &pb.TrainerMessage_Hello{Hello: h}}); err != nil {
		return nil, err
	}
	for {
		m, err := stream.Recv()
		if err != nil {
			close(tr.ended)
			return nil, err
		}
		if w := m.GetWaiting(); w != nil {
			tr.waiting = append(tr.waiting, w.Reason)
			continue
		}
		if w := m.GetWelcome(); w != nil {
			tr.welcome = w
			break
		}
	}
	go tr.serve()
	return tr, nil
}

// serve answers the daemon's requests until the session ends.
func (tr *trainer) serve() {
	defer close(tr.ended)
	for {
		m, err := tr.stream.Recv()
		if err != nil {
			return
		}
		if c := m.GetStateChunk(); c != nil {
			tr.mu.Lock()
			tr.chunks = append(tr.chunks, c)
			tr.mu.Unlock()
			continue
		}
		if r := m.GetParamsRequest(); r != nil && r.WantState {
			tr.mu.Lock()
			f := tr.state
			tr.stated++
			tr.mu.Unlock()
			if f != nil { // the range asked for, as a trainer of a large state answers
				st := f()
				data := st.Data[min(int(r.StateOffset), len(st.Data)):]
				if r.StateLength > 0 {
					data = data[:min(int(r.StateLength), len(data))]
				}
				part := &pb.TrainerState{Kind: st.Kind, Step: st.Step, Data: data, Offset: r.StateOffset, TotalSize: uint64(len(st.Data))}
				_ = tr.stream.Send(&pb.TrainerMessage{Msg: &pb.TrainerMessage_Params{Params: &pb.ParamsReply{Id: r.Id, State: part}}})
			}
		} else if r != nil {
			tr.mu.Lock()
			tr.asked++
			f := tr.params
			tr.mu.Unlock()
			if f == nil {
				continue
			}
			step, p := f()
			_ = tr.stream.Send(&pb.TrainerMessage{Msg: &pb.TrainerMessage_Params{Params: &pb.ParamsReply{Id: r.Id, Step: step, Params: dataTensor(f32bytes(p))}}})
		}
	}
}

func (tr *trainer) close() {
	tr.cancel()
	if tr.stream != nil {
		<-tr.ended
	}
}

func (tr *trainer) session() string { return tr.welcome.Session }

// with is ctx carrying the session in its metadata, as every call of a
// session must.
func (tr *trainer) with(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx, SessionKey, tr.session())
}

// step publishes delta for step s, passes the barrier for s+1 and pulls.
func (tr *trainer) step(ctx context.Context, s int64, delta []float32) (*pb.StepReply, error) {
	return tr.c.Step(tr.with(ctx), &pb.StepRequest{Step: s, Update: dataTensor(f32bytes(delta))})
}

func f32bytes(v []float32) []byte {
	b := make([]byte, 0, 4*len(v))
	for _, x := range v {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
	}
	return b
}

func f32s(b []byte) []float32 {
	v := make([]float32, len(b)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v
}

func fill(n int, x float32) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = x
	}
	return v
}

// waitFor polls cond every 10 ms until it holds or timeout passes.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// peersKnow waits until every daemon's overlay knows all the others.
func peersKnow(t testing.TB, ds ...*daemon) {
	t.Helper()
	waitFor(t, 20*time.Second, "the daemons to know each other", func() bool {
		for _, d := range ds {
			if d.node.Overlay().PeerCount() < len(ds)-1 {
				return false
			}
		}
		return true
	})
}

var errTimeout = errors.New("timeout")

// connectShm is connect, asking for shared memory when shm is set; the
// trainer maps the shared file and says so.
func connectShm(t testing.TB, addr string, h *pb.Hello, shm bool) (*trainer, error) {
	h.SharedMemory = shm
	tr, err := connect(t, addr, h, nil)
	if err != nil || !shm || tr.welcome.ShmPath == "" {
		return tr, err
	}
	mem, err := mapShared(tr.welcome.ShmPath, int(tr.welcome.ShmSize))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unmapShared(mem) })
	tr.shm = mem
	if err := tr.stream.Send(&pb.TrainerMessage{Msg: &pb.TrainerMessage_ShmReady{ShmReady: &pb.SharedMemoryReady{Ok: true}}}); err != nil {
		t.Fatal(err)
	}
	return tr, nil
}

// stepShm is step, through the shared file when the trainer has one.
func (tr *trainer) stepShm(ctx context.Context, s int64, update []float32) (*pb.StepReply, error) {
	if tr.shm == nil {
		return tr.step(ctx, s, update)
	}
	off := int(tr.welcome.ShmOffset)
	copy(tr.shm[off:off+4*len(update)], f32.Bytes(update)) // as a trainer writes its update in place
	return tr.c.Step(tr.with(ctx), &pb.StepRequest{Step: s, Update: sharedTensor(off)})
}

// pulled is the vector of a PullReply (a copy), nil when it merges
// nothing: under gossip the sum to add, under epidemic the model to take.
func (tr *trainer) pulled(r *pb.PullReply) []float32 {
	if r == nil || r.Merged == 0 {
		return nil
	}
	return tr.tensor(r.Update)
}

// tensor is a copy of the values of a tensor the daemon sent.
func (tr *trainer) tensor(t *pb.Tensor) []float32 {
	if sh := t.GetShared(); sh != nil {
		off := int(sh.Offset)
		return append([]float32(nil), f32s(tr.shm[off:off+4*tr.n])...)
	}
	return f32s(t.GetData())
}
