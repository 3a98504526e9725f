package trainer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pspnode/pspnode/internal/f32"
	"github.com/pspnode/pspnode/node"
	"github.com/pspnode/pspnode/node/exchange"
	pb "github.com/pspnode/pspnode/node/trainer/trainerpb"
	"github.com/pspnode/pspnode/psp"
)

// session is one trainer's connection: from Hello until its stream ends.
type session struct {
	srv    *Server
	id     string
	hello  *pb.Hello
	client string
	since  time.Time
	n      int // parameters
	stream pb.Trainer_SessionServer
	sendMu sync.Mutex // stream.Send is not safe for concurrent use

	ctx    context.Context // ends with the stream, or when the daemon stops
	cancel context.CancelCauseFunc
	done   chan struct{} // closed when the session is over

	op chan struct{} // one call at a time (a semaphore: waits honour ctx)

	// The model's vector. With a shared file, x is its region, which the
	// trainer and the daemon read and write in turn (see the .proto
	// file); shmMu is held to read it outside a call, and release unmaps
	// it under it. Without one, x is the daemon's buffer (epidemic: the
	// trainer's model as it last came; gossip: made for each pull).
	shm   *shmFile
	shmMu sync.RWMutex
	shmOK atomic.Bool // the trainer mapped the shared file
	x     []float32

	// gossip: published deltas go to the exchange on the push loop, which
	// copies each into its message and then signs and sends it off the
	// trainer's path.
	pushes chan push
	pushed chan struct{} // closed when the push loop has ended

	pmu     sync.Mutex
	waiters map[uint64]chan *pb.ParamsReply
	nextID  uint64
}

// push is one step's delta (gossip) on its way to the exchange.
type push struct {
	step   int64
	v      []float32
	copied chan struct{} // closed once v is copied into its message
}

func newSessionID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Session is one trainer's connection (see the .proto file).
func (s *Server) Session(stream pb.Trainer_SessionServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	hello := first.GetHello()
	if hello == nil {
		s.m.refused.WithLabelValues("protocol").Inc()
		return failure(codes.InvalidArgument, pb.ErrorReason_ERROR_REASON_PROTOCOL, "the first message of a session must be Hello")
	}
	if err := s.checkHello(hello); err != nil {
		s.m.refused.WithLabelValues("hello").Inc()
		return err
	}
	ctx, cancel := context.WithCancelCause(stream.Context())
	sess := &session{
		srv: s, id: newSessionID(), hello: hello, since: time.Now(), n: int(hello.NumParams),
		stream: stream, ctx: ctx, cancel: cancel, done: make(chan struct{}),
		op: make(chan struct{}, 1), waiters: make(map[uint64]chan *pb.ParamsReply),
		client: hello.Client,
	}
	if sess.client == "" {
		sess.client = "unnamed trainer"
	}
	defer close(sess.done)
	defer cancel(nil)
	if err := s.claim(sess); err != nil {
		s.m.refused.WithLabelValues("busy").Inc()
		return err
	}
	reason := "the trainer closed its session"
	defer func() { s.release(sess, reason) }()
	if err := sess.start(); err != nil {
		reason = "the session did not start: " + status.Convert(err).Message()
		return err
	}
	for {
		msg, err := stream.Recv()
		if err != nil {
			if c := context.Cause(ctx); c != nil && ctx.Err() != nil && !errors.Is(c, context.Canceled) {
				reason = c.Error()
				return failure(codes.Unavailable, pb.ErrorReason_ERROR_REASON_DAEMON_STOPPING, c.Error())
			}
			return nil
		}
		switch m := msg.Msg.(type) {
		case *pb.TrainerMessage_Params:
			sess.deliver(m.Params)
		case *pb.TrainerMessage_ShmReady:
			if sess.shm == nil {
				continue
			}
			if m.ShmReady.Ok {
				sess.shmOK.Store(true)
			} else {
				s.log.Warn("the trainer could not map the shared file: tensors go through the socket", "err", m.ShmReady.Error)
			}
			sess.shm.unlink() // mapped by both (or not at all): the name can go
		default:
			reason = "protocol error: a second Hello"
			return failure(codes.InvalidArgument, pb.ErrorReason_ERROR_REASON_PROTOCOL, "Hello comes once per session; after it the trainer sends only ParamsReply and SharedMemoryReady")
		}
	}
}

// checkHello checks what a trainer says of itself.
func (s *Server) checkHello(h *pb.Hello) error {
	maxParams := uint64(s.cfg.MaxMessageBytes-4096) / 4
	shared := h.SharedMemory && s.cfg.SharedMemory && sharedMemorySupported
	epidemic := s.drv.Info().Exchange.Kind == exchange.Epidemic
	switch {
	case h.ApiVersion != pb.ApiVersion_API_VERSION_3:
		return failure(codes.InvalidArgument, pb.ErrorReason_ERROR_REASON_API_VERSION,
			fmt.Sprintf("API version %d: this daemon speaks version 3 (pspnode %s): use the client of the same release", h.ApiVersion, node.Version()),
			"api_version", strconv.Itoa(int(h.ApiVersion)), "supported", "3")
	case h.Dtype != pb.DType_DTYPE_FLOAT32:
		return badHello("dtype", "dtype %v: the trainer API exchanges float32 vectors only; convert the model's parameters to float32", h.Dtype)
	case h.NumParams == 0:
		return badHello("num_params", "num_params is 0: a trainer needs a model with parameters")
	case h.NumParams > 1<<31-1:
		return badHello("num_params", "num_params %d: at most 2³¹−1", h.NumParams)
	case h.NumParams > maxParams && !(shared && epidemic):
		why := "the trainer asked for no shared memory"
		switch {
		case !s.cfg.SharedMemory || !sharedMemorySupported:
			why = "this daemon offers none (--trainer-shm, Linux)"
		case shared:
			why = "under gossip a peer's fetch of the model asks the trainer for it through the socket"
		}
		return badHelloMax("num_params", maxParams, "num_params %d: a model of %s does not fit in one message on the socket (%d parameters at most with --trainer-max-message %d), and %s: start the daemon with --trainer-max-message %d or more, or use shared memory (a trainer on this machine, the epidemic exchange)",
			h.NumParams, mib(4*h.NumParams), maxParams, s.cfg.MaxMessageBytes, why, 4*h.NumParams+4096)
	case h.ModelId == 0:
		return badHello("model_id", "model_id is 0: give the model an ID (the Python client derives one from the name and the parameter shapes)")
	case h.ModelName == "" || len(h.ModelName) > 256:
		return badHello("model_name", "model_name must be 1 to 256 bytes")
	case h.Step < 0 || h.Step > psp.MaxStep:
		return badHello("step", "step %d: want the steps the parameters have taken, 0 to %d", h.Step, psp.MaxStep)
	case len(h.Client) > 512:
		return badHello("client", "client must be at most 512 bytes")
	case len(h.StateKind) > maxStateKind:
		return badHello("state_kind", "state_kind must be at most %d bytes", maxStateKind)
	}
	// The daemon holds about three vectors of the model (its model, the
	// round's sum, the shared region; under gossip the sum, the region
	// and a message): refused before any is made if the machine has not
	// the memory.
	need := 3 * 4 * h.NumParams
	if avail := memAvailable(); avail > 0 && need > avail {
		return badHelloMax("num_params", avail/12, "num_params %d: the daemon holds about three copies of a model of %s, %s, and this machine has %s available: use a smaller model, or free memory",
			h.NumParams, mib(4*h.NumParams), mib(need), mib(avail))
	}
	return nil
}

// mib says a byte count in MiB or GiB.
func mib(b uint64) string {
	if b >= 10<<30 {
		return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30))
	}
	return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
}

// claim makes sess the connected trainer's, or says who is connected.
func (s *Server) claim(sess *session) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return failure(codes.Unavailable, pb.ErrorReason_ERROR_REASON_DAEMON_STOPPING, "the daemon is stopping")
	case s.sess != nil:
		return trainerConnected(s.sess.client, time.Since(s.sess.since))
	}
	s.sess = sess
	return nil
}

// start runs a session's Hello: the model, the wait for the job, the
// step and model to start from, shared memory, and Welcome.
func (sess *session) start() error {
	s, h, ctx := sess.srv, sess.hello, sess.ctx
	info := s.drv.Info()
	epidemic := info.Exchange.Kind == exchange.Epidemic
	report := func(reason string, waited time.Duration) {
		_ = sess.send(&pb.DaemonMessage{Msg: &pb.DaemonMessage_Waiting{Waiting: &pb.Waiting{Reason: reason, WaitedS: waited.Seconds()}}})
	}
	if err := s.drv.Ready(); err != nil {
		report(err.Error(), 0)
	}
	var err error
	if _, _, n := s.task.shape(); n == 0 { // the model is not fixed yet: check it against the job's first (modelcheck.go)
		err = s.checkJobModel(ctx, h.ModelId, sess.n, report)
	}
	changed := false
	if err == nil {
		changed, err = s.task.fix(h.ModelName, h.ModelId, sess.n, epidemic)
		if err != nil {
			s.m.refused.WithLabelValues("model").Inc()
			s.log.Warn("trainer refused", "client", sess.client, "err", err)
			return s.fixedMismatch(err, h, sess.n)
		}
		if err := s.drv.Attach(ctx); err != nil {
			return failuref(codes.Internal, pb.ErrorReason_ERROR_REASON_INTERNAL, "setting up the exchange for the model: %v", err)
		}
		if changed {
			s.log.Info("model fixed by the first trainer", "model", h.ModelName, "model_id", fmt.Sprintf("%#08x", h.ModelId), "params", sess.n)
		}
	}
	if err == nil {
		err = sess.alloc(h.SharedMemory && s.cfg.SharedMemory && sharedMemorySupported)
	}
	var st node.Start
	if err == nil {
		// The job's parameters, when the session starts from them, come
		// straight into the session's vector: the shared region the
		// trainer reads them from.
		st, err = s.drv.Begin(ctx, h.Step, report, sess.x)
	}
	if mm := (*node.ModelMismatchError)(nil); errors.As(err, &mm) {
		s.m.refused.WithLabelValues("model").Inc()
		err := jobMismatch(mm, h, sess.n)
		s.log.Warn("trainer refused", "client", sess.client, "err", status.Convert(err).Message())
		return err
	}
	if err != nil {
		if ctx.Err() != nil {
			return status.FromContextError(ctx.Err()).Err()
		}
		return failuref(codes.Unavailable, pb.ErrorReason_ERROR_REASON_NOT_READY, "%v; try again", err)
	}
	var read func(lo, hi int, dst []float32) bool
	if epidemic {
		read = s.drv.ReadModel
	}
	s.task.begin(sess, read)
	pop, scale := s.drv.Population()
	w := &pb.Welcome{
		Session: sess.id, Step: st.Step, HasParams: st.Params != nil, ParamsSource: st.Source,
		Job: info.Job, PeerId: info.PeerID, Barrier: info.Barrier.String(), Exchange: info.Exchange.String(),
		UpdateKind: pb.UpdateKind_UPDATE_KIND_DELTA, Population: pop, LrScale: scale,
		MaxAbsValue: info.MaxAbsValue, ModelId: h.ModelId,
	}
	if epidemic {
		w.UpdateKind = pb.UpdateKind_UPDATE_KIND_MODEL
	}
	if sess.shm != nil {
		w.ShmPath, w.ShmSize, w.ShmOffset = sess.shm.path, uint64(len(sess.shm.mem)), 0
	}
	var rest *stateFetch
	if st.Params != nil {
		w.Params = sess.give(st.Params)
		if h.StateKind != "" { // the job's state beside its parameters (state.go)
			w.State, w.StateSource, rest = s.fetchState(ctx, h.StateKind, int64(st.Step))
		}
	}
	sess.pushes, sess.pushed = make(chan push, 1), make(chan struct{})
	go sess.pushLoop() // before Welcome: release expects it once the session started
	if err := sess.send(&pb.DaemonMessage{Msg: &pb.DaemonMessage_Welcome{Welcome: w}}); err != nil {
		return err
	}
	if rest != nil {
		if err := rest.rest(ctx, sess, w.State); err != nil {
			return err
		}
	}
	s.drv.Activate(sess.client)
	s.m.sessions.Inc()
	s.m.connected.Set(1)
	return nil
}

// alloc makes the session's vector: the region of a shared file when
// withShm (and one can be made), else a buffer of the daemon's under
// epidemic (gossip makes one per pull). A model too large for a message
// needs the shared file.
func (sess *session) alloc(withShm bool) error {
	n := sess.n
	if withShm {
		shm, err := createShared(sess.srv.cfg.SharedDir, (4*n+4095)&^4095)
		if err == nil {
			sess.shm = shm
			sess.x, _ = asFloats(shm.mem[:4*n])
		} else {
			sess.srv.log.Warn("no shared memory for the trainer: tensors go through the socket", "err", err)
			if 4*n+4096 > sess.srv.cfg.MaxMessageBytes {
				return failuref(codes.ResourceExhausted, pb.ErrorReason_ERROR_REASON_BAD_HELLO,
					"no shared file could be made for a model of %s (%v), and it does not fit in one message on the socket (--trainer-max-message %d)",
					mib(uint64(4*n)), err, sess.srv.cfg.MaxMessageBytes)
			}
		}
	}
	if sess.x == nil && sess.srv.task.epidemic {
		sess.x = make([]float32, n)
	}
	return nil
}

// give is x for the trainer (the session's vector, which the daemon just
// wrote, or the job's parameters): the shared region, holding x, when the
// session has one, else a copy of x in a message.
func (sess *session) give(x []float32) *pb.Tensor {
	if sess.shm != nil {
		if len(x) > 0 && &x[0] != &sess.x[0] {
			copy(sess.x, x)
		}
		return sharedTensor(0)
	}
	return dataTensor(appendFloat32(make([]byte, 0, 4*len(x)), x))
}

// send sends one message on the session's stream.
func (sess *session) send(m *pb.DaemonMessage) error {
	sess.sendMu.Lock()
	defer sess.sendMu.Unlock()
	return sess.stream.Send(m)
}

// release ends sess: the node leaves its peers' barriers, pushes in
// flight finish, the task stops taking updates, and the shared file goes.
func (s *Server) release(sess *session, why string) {
	sess.cancel(errors.New(why))
	if sess.pushes != nil { // it started
		s.drv.Deactivate(why)
		s.m.connected.Set(0)
		close(sess.pushes)
		<-sess.pushed
		sess.op <- struct{}{} // no call runs from here on
		s.task.end(sess)
		s.log.Info("trainer disconnected", "client", sess.client, "why", why, "connected_for", time.Since(sess.since).Round(time.Millisecond))
	}
	if sess.shm != nil {
		sess.shmMu.Lock() // the push loop may be reading the region
		sess.shm.close()
		sess.shmMu.Unlock()
	}
	s.mu.Lock()
	if s.sess == sess {
		s.sess = nil
	}
	s.mu.Unlock()
}

// requestParams asks the trainer for its parameters and the steps they
// have taken, within ParamsTimeout.
func (sess *session) requestParams(ctx context.Context) ([]float32, int64, error) {
	r, err := sess.ask(ctx, &pb.ParamsRequest{})
	if err != nil {
		return nil, 0, err
	}
	p, err := sess.readParams(r)
	if err != nil {
		sess.srv.m.paramsRequests.WithLabelValues("bad").Inc()
		sess.srv.log.Warn("the trainer's parameters were refused", "err", err)
		return nil, 0, err
	}
	sess.srv.m.paramsRequests.WithLabelValues("ok").Inc()
	return p, r.Step, nil
}

// ask sends the trainer req (its ID set here) and returns its answer,
// within ParamsTimeout.
func (sess *session) ask(ctx context.Context, req *pb.ParamsRequest) (*pb.ParamsReply, error) {
	ctx, cancel := context.WithTimeout(ctx, sess.srv.cfg.ParamsTimeout)
	defer cancel()
	sess.pmu.Lock()
	sess.nextID++
	id := sess.nextID
	ch := make(chan *pb.ParamsReply, 1)
	sess.waiters[id] = ch
	sess.pmu.Unlock()
	defer func() {
		sess.pmu.Lock()
		delete(sess.waiters, id)
		sess.pmu.Unlock()
	}()
	req.Id = id
	if err := sess.send(&pb.DaemonMessage{Msg: &pb.DaemonMessage_ParamsRequest{ParamsRequest: req}}); err != nil {
		sess.srv.m.paramsRequests.WithLabelValues("error").Inc()
		return nil, fmt.Errorf("asking the trainer for its parameters: %w", err)
	}
	select {
	case r := <-ch:
		return r, nil
	case <-ctx.Done():
		sess.srv.m.paramsRequests.WithLabelValues("timeout").Inc()
		return nil, fmt.Errorf("the trainer did not send its parameters within %v", sess.srv.cfg.ParamsTimeout)
	case <-sess.ctx.Done():
		return nil, errors.New("the trainer disconnected")
	}
}

// deliver hands a ParamsReply to the request waiting for it.
func (sess *session) deliver(r *pb.ParamsReply) {
	sess.pmu.Lock()
	ch := sess.waiters[r.Id]
	sess.pmu.Unlock()
	if ch == nil {
		sess.srv.log.Debug("a ParamsReply nobody waits for (it came late)", "id", r.Id)
		return
	}
	select {
	case ch <- r:
	default:
	}
}

// readParams decodes the parameters in a ParamsReply (in data).
func (sess *session) readParams(r *pb.ParamsReply) ([]float32, error) {
	if r.Params.GetShared() != nil {
		return nil, errors.New("parameters in the shared file: a ParamsReply carries them in data")
	}
	v, err := sess.data(r.Params, "parameters")
	if err != nil {
		return nil, err
	}
	if r.Step < 0 || r.Step > psp.MaxStep {
		return nil, fmt.Errorf("parameters at step %d, want 0 to %d", r.Step, psp.MaxStep)
	}
	if bad := badValue(v, maxFloat32); bad != "" {
		return nil, fmt.Errorf("parameters: %s", bad)
	}
	p := make([]float32, sess.n)
	toFloat32(p, v)
	return p, nil
}

// maxFloat32 is the largest finite float32: a bound that refuses only
// NaN and ±Inf.
const maxFloat32 = 3.4028234663852886e38

// data returns the bytes of a tensor in data, checked for length.
func (sess *session) data(t *pb.Tensor, what string) ([]byte, error) {
	if t == nil {
		return nil, fmt.Errorf("no %s tensor", what)
	}
	data := t.GetData()
	if len(data) != 4*sess.n {
		return nil, fmt.Errorf("%s of %d bytes: the model has %d float32 parameters, %d bytes", what, len(data), sess.n, 4*sess.n)
	}
	return data, nil
}

// vector returns the values of a tensor the trainer sent, as float32: the
// region of the shared file, or its data (viewed in place when it can be,
// else copied into the session's buffer, or a new one). An update's data
// goes into the session's buffer under epidemic (the model the session's
// next pull averages into); other tensors (keep) never do.
func (sess *session) vector(t *pb.Tensor, what string) ([]float32, error) {
	return sess.tensorOf(t, what, false)
}

func (sess *session) tensorOf(t *pb.Tensor, what string, keep bool) ([]float32, error) {
	if t == nil {
		return nil, fmt.Errorf("no %s tensor", what)
	}
	if sh := t.GetShared(); sh != nil {
		if sess.shm == nil {
			return nil, fmt.Errorf("%s marked shared, but this session has no shared file", what)
		}
		if sh.Offset != 0 {
			return nil, fmt.Errorf("%s at offset %d of the shared file: its region is at 0", what, sh.Offset)
		}
		// A trainer that sends a shared tensor has mapped the file, even
		// if its SharedMemoryReady (on the stream) has not arrived yet.
		sess.shmOK.Store(true)
		return sess.x, nil
	}
	data, err := sess.data(t, what)
	if err != nil {
		return nil, err
	}
	if sess.x != nil && sess.shm == nil && !keep {
		f32.Decode(sess.x, data) // epidemic: the buffer that holds the trainer's model
		return sess.x, nil
	}
	if v, ok := f32.View(data); ok && len(v) == sess.n {
		return v, nil
	}
	v := make([]float32, sess.n)
	f32.Decode(v, data)
	return v, nil
}

// pushLoop hands published deltas (gossip) to the exchange, in order: the
// exchange copies each into its message (the call that published it waits
// for that), then signs and sends it off the trainer's path.
func (sess *session) pushLoop() {
	defer close(sess.pushed)
	for p := range sess.pushes {
		sess.shmMu.RLock() // v may be the shared region
		copied := sync.OnceFunc(func() { sess.shmMu.RUnlock(); close(p.copied) })
		if err := sess.srv.drv.Push(p.step, p.v, copied); err != nil {
			sess.srv.log.Warn("update not sent", "step", p.step, "err", err)
		}
		copied()
	}
}
