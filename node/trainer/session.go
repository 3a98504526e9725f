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

	shm       *shmFile
	shmMu     sync.RWMutex // held to read shm outside a call (ParamsReply); release unmaps under it
	shmOK     atomic.Bool  // the trainer mapped the shared file
	upOff     [2]int       // regions of the shared file, in bytes: updates of even and odd steps
	paramsOff int
	downOff   [2]int
	// readDone is closed when the push loop has read the last published
	// update out of its region of the shared file; the next step's call
	// waits for it before it returns, since the trainer may then write
	// that region again.
	readDone chan struct{}

	// Publish buffers, two so that a step's push can run while the next
	// step is published; free[i] holds a token while raw[i] is free.
	raw      [2][]byte
	f32      [2][]float32 // raw[i] as float32 when it cannot be viewed in place
	free     [2]chan struct{}
	pushes   chan push
	pushed   chan struct{} // closed when the push loop has ended
	callDone chan struct{} // the running call's: closed when it returns (under op)

	pmu     sync.Mutex
	waiters map[uint64]chan *pb.ParamsReply
	nextID  uint64
}

// push is one step's delta (gossip) on its way to the exchange.
type push struct {
	step  int64
	slot  int
	after chan struct{} // closed when the call that published it has returned
	read  chan struct{} // closed once raw[slot] has been read (nil: nothing to signal)
}

// pushAfterReply is how long the push loop lets a call's reply go out
// before it starts the push's work (milliseconds of CPU for a large
// model: started at once, it held the reply back 2 ms, measured with a
// model of 1 M parameters on 2 cores).
const pushAfterReply = time.Millisecond

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
	switch {
	case h.ApiVersion != pb.ApiVersion_API_VERSION_2:
		return failure(codes.InvalidArgument, pb.ErrorReason_ERROR_REASON_API_VERSION,
			fmt.Sprintf("API version %d: this daemon speaks version 2 (pspnode %s)", h.ApiVersion, node.Version()),
			"api_version", strconv.Itoa(int(h.ApiVersion)), "supported", "2")
	case h.Dtype != pb.DType_DTYPE_FLOAT32:
		return badHello("dtype", "dtype %v: the trainer API exchanges float32 vectors only; convert the model's parameters to float32", h.Dtype)
	case h.NumParams == 0:
		return badHello("num_params", "num_params is 0: a trainer needs a model with parameters")
	case h.NumParams > maxParams:
		return badHello("num_params", "num_params %d exceeds what fits in one message (%d; start the daemon with a larger --trainer-max-message)", h.NumParams, maxParams)
	case h.NumParams > 1<<31-1:
		return badHello("num_params", "num_params %d: at most 2³¹−1", h.NumParams)
	case h.ModelId == 0:
		return badHello("model_id", "model_id is 0: give the model an ID (the Python client derives one from the name and the parameter shapes)")
	case h.ModelName == "" || len(h.ModelName) > 256:
		return badHello("model_name", "model_name must be 1 to 256 bytes")
	case h.Step < 0:
		return badHello("step", "step %d: want the steps the parameters have taken, >= 0", h.Step)
	case len(h.Client) > 512:
		return badHello("client", "client must be at most 512 bytes")
	case len(h.StateKind) > maxStateKind:
		return badHello("state_kind", "state_kind must be at most %d bytes", maxStateKind)
	}
	return nil
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
	var st node.Start
	if err == nil {
		st, err = s.drv.Begin(ctx, h.Step, report)
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
	sess.alloc(h.SharedMemory && s.cfg.SharedMemory && sharedMemorySupported)
	var model func() []float64
	if epidemic {
		model = s.drv.Model
	}
	s.task.begin(sess, sess.accumulators(), model)
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
	if st.Params != nil {
		w.Params = dataTensor(appendFloat64As32(make([]byte, 0, 4*len(st.Params)), st.Params))
		if h.StateKind != "" { // the job's state beside its parameters (state.go)
			w.State, w.StateSource = s.fetchState(ctx, h.StateKind)
		}
	}
	if sess.shm != nil {
		w.ShmPath, w.ShmSize = sess.shm.path, uint64(len(sess.shm.mem))
		w.ShmUpOffset, w.ShmUpOddOffset, w.ShmParamsOffset = uint64(sess.upOff[0]), uint64(sess.upOff[1]), uint64(sess.paramsOff)
	}
	go sess.pushLoop() // before Welcome: release expects it once the buffers exist
	if err := sess.send(&pb.DaemonMessage{Msg: &pb.DaemonMessage_Welcome{Welcome: w}}); err != nil {
		return err
	}
	s.drv.Activate(sess.client)
	s.m.sessions.Inc()
	s.m.connected.Set(1)
	return nil
}

// alloc makes the session's buffers, in a shared file when withShm (and
// it can be made).
func (sess *session) alloc(withShm bool) {
	n := sess.n
	region := (4*n + 4095) &^ 4095
	if withShm {
		shm, err := createShared(sess.srv.cfg.SharedDir, 5*region)
		if err != nil {
			sess.srv.log.Warn("no shared memory for the trainer: tensors go through the socket", "err", err)
		} else {
			sess.shm = shm
			sess.upOff, sess.paramsOff = [2]int{0, region}, 2*region
			sess.downOff = [2]int{3 * region, 4 * region}
		}
	}
	for i := range 2 {
		sess.free[i] = make(chan struct{}, 1)
		sess.free[i] <- struct{}{}
	}
	sess.pushes = make(chan push, 2)
	sess.pushed = make(chan struct{})
}

// accumulators are the two buffers the task adds peers' updates into: the
// down regions of the shared file, or memory of the daemon's.
func (sess *session) accumulators() [2][]float32 {
	var acc [2][]float32
	for i := range 2 {
		if sess.shm != nil {
			f, _ := asFloats(sess.shm.mem[sess.downOff[i] : sess.downOff[i]+4*sess.n])
			acc[i] = f
		} else {
			acc[i] = make([]float32, sess.n)
		}
	}
	return acc
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
		if sess.shm != nil {
			sess.shmMu.Lock() // a peer's model fetch may be reading the params region
			sess.shm.close()
			sess.shmMu.Unlock()
		}
		s.log.Info("trainer disconnected", "client", sess.client, "why", why, "connected_for", time.Since(sess.since).Round(time.Millisecond))
	}
	s.mu.Lock()
	if s.sess == sess {
		s.sess = nil
	}
	s.mu.Unlock()
}

// requestParams asks the trainer for its parameters and the steps they
// have taken, within ParamsTimeout.
func (sess *session) requestParams(ctx context.Context) ([]float64, int64, error) {
	r, err := sess.ask(ctx, false)
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

// ask sends the trainer a ParamsRequest (for its state too when
// wantState) and returns its answer, within ParamsTimeout.
func (sess *session) ask(ctx context.Context, wantState bool) (*pb.ParamsReply, error) {
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
	req := &pb.ParamsRequest{Id: id, WantState: wantState}
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

// readParams decodes the parameters in a ParamsReply.
func (sess *session) readParams(r *pb.ParamsReply) ([]float64, error) {
	sess.shmMu.RLock()
	defer sess.shmMu.RUnlock()
	if sess.shm != nil && sess.shm.mem == nil {
		return nil, errors.New("the session ended")
	}
	v, err := sess.vector(r.Params, sess.paramsOff, "parameters")
	if err != nil {
		return nil, err
	}
	if r.Step < 0 {
		return nil, fmt.Errorf("parameters at step %d", r.Step)
	}
	if bad := badValue(v, maxFloat32); bad != "" {
		return nil, fmt.Errorf("parameters: %s", bad)
	}
	p := make([]float64, sess.n)
	toFloat64(p, v)
	return p, nil
}

// maxFloat32 is the largest finite float32: a bound that refuses only
// NaN and ±Inf.
const maxFloat32 = 3.4028234663852886e38

// vector returns the bytes of a tensor the trainer sent: its data, or its
// region of the shared file (at off), checked for length.
func (sess *session) vector(t *pb.Tensor, off int, what string) ([]byte, error) {
	if t == nil {
		return nil, fmt.Errorf("no %s tensor", what)
	}
	if sh := t.GetShared(); sh != nil {
		if sess.shm == nil {
			return nil, fmt.Errorf("%s marked shared, but this session has no shared file", what)
		}
		if sh.Offset != uint64(off) {
			return nil, fmt.Errorf("%s at offset %d of the shared file: its region is at %d", what, sh.Offset, off)
		}
		// A trainer that sends a shared tensor has mapped the file, even
		// if its SharedMemoryReady (on the stream) has not arrived yet.
		sess.shmOK.Store(true)
		return sess.shm.mem[off : off+4*sess.n], nil
	}
	data := t.GetData()
	if len(data) != 4*sess.n {
		return nil, fmt.Errorf("%s of %d bytes: the model has %d float32 parameters, %d bytes", what, len(data), sess.n, 4*sess.n)
	}
	return data, nil
}

// pushLoop hands published deltas (gossip) to the exchange, in order, off
// the trainer's path: signing and sending a large update takes
// milliseconds the trainer need not wait for.
func (sess *session) pushLoop() {
	defer close(sess.pushed)
	for p := range sess.pushes {
		<-p.after
		time.Sleep(pushAfterReply)
		// raw may be a region of the shared file: it is read under shmMu,
		// and released (the trainer may write it again, the session may
		// unmap it) as soon as the update is copied into its message,
		// before the signing and sending.
		sess.shmMu.RLock()
		released := false
		release := func() {
			if released {
				return
			}
			released = true
			sess.shmMu.RUnlock()
			if p.read != nil {
				close(p.read)
			}
			sess.free[p.slot] <- struct{}{}
		}
		if err := sess.srv.drv.Push32(p.step, sess.floats(p.slot), release); err != nil {
			sess.srv.log.Warn("update not sent", "step", p.step, "err", err)
		}
		release()
	}
}

// floats is raw[slot] as float32 values: a view of it where it is
// aligned on a little-endian CPU (the shared file's regions always are),
// else a copy into the slot's own buffer.
func (sess *session) floats(slot int) []float32 {
	if v, ok := f32.View(sess.raw[slot]); ok && len(v) == sess.n {
		return v
	}
	if sess.f32[slot] == nil {
		sess.f32[slot] = make([]float32, sess.n)
	}
	f32.Decode(sess.f32[slot], sess.raw[slot])
	return sess.f32[slot]
}
