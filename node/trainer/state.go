package trainer

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	"github.com/pspnode/pspnode/internal/wire"
	pb "github.com/pspnode/pspnode/node/trainer/trainerpb"
)

// Trainer state: what a trainer keeps beside its parameters that a
// joining worker's trainer needs as well (a DiLoCo trainer's outer
// parameters and outer momentum). The node's model protocol carries the
// parameters only; the state travels over a protocol of its own, served by
// this package and opaque to it:
//
//   - a trainer names the kind of state it keeps in Hello.state_kind;
//   - a peer's daemon asked for a range of the state (StateProtocol) asks
//     its trainer for that range (ParamsRequest.want_state, state_offset,
//     state_length) and answers with it, if its kind is the asker's;
//   - a session whose Hello names a kind and that starts from the job's
//     parameters (the job is ahead) gets a peer's state: the first chunk
//     in Welcome, the rest as StateChunk messages on its stream. The
//     daemon fetches it a chunk (stateChunk bytes) at a time, so a state
//     of hundreds of megabytes needs no copy of itself in either daemon;
//     a chunk a peer does not give is asked of another peer, from where
//     it stopped.
//
// A state decides how a joiner's trainer goes on, so neither side takes a
// peer's word for it:
//
//   - a daemon answers only peers of the job (Driver.Member: known
//     first-hand, not heard on another lineage), one stream per peer and
//     stateStreams in all, and within a byte budget per minute: per peer
//     statePeerBudget times the state's size (a joiner fetches it once,
//     with room for a retry), in all stateAllBudget times. A request of
//     about 20 bytes answered by a chunk of up to stateChunk is the
//     protocol's amplification; the budget bounds what a peer can make a
//     node send in a minute, however many requests it makes, and the
//     trainer is asked only for requests within it;
//   - a joining daemon takes the first chunk of two peers' states before
//     it takes either, and prefers a state two peers agree on (its size,
//     and steps within stateStepSlack of each other); a state whose step
//     is more than stateStepSlack from the step the job's peers gave the
//     joiner is refused, however many peers serve it; one peer's state is
//     taken only when no two agree, and said so;
//   - the trainer (the Python client's DiLoCo) checks the values against
//     the job's MaxAbsValue and its outer parameters against the job's
//     parameters, which the model protocol fetched from several peers.
//
// A request is one byte, stateVersion, the kind asked for (a uvarint
// length and its bytes), then the range: offset (u64) and length (u32),
// big-endian. The answer is a uvarint length and a marshalled
// TrainerState (the range's bytes, its offset and the state's total
// size), or a stream reset for none.

// StateProtocol is the protocol ID of job's trainer-state protocol.
func StateProtocol(job string) protocol.ID {
	return wire.TrainerStateProtocol(job)
}

const (
	stateVersion = 2
	// maxStateKind bounds Hello.state_kind and TrainerState.kind.
	maxStateKind = 256
	// stateTries is how many peers a joining session asks for a state.
	stateTries = 4
	// stateChunk is the most of a state one request moves.
	stateChunk = 4 << 20
	// stateStreams caps the inbound trainer-state streams in all (one per
	// peer): each holds the trainer for a chunk.
	stateStreams = 4
	// statePeerBudget and stateAllBudget are the bytes of state a daemon
	// serves in a minute, per peer and in all, in states' sizes (at least
	// stateChunk's).
	statePeerBudget = 2
	stateAllBudget  = 8
	// stateMinCharge is the least a request costs of the budget, so that
	// a small state does not let a peer ask the trainer without end (a
	// request asks the trainer: at most statePeerBudget × stateChunk /
	// stateMinCharge = 32 per peer and 128 in all a minute).
	stateMinCharge = stateChunk / 16
	// stateStepSlack is how far (in steps) a state may be from the job's
	// step, and two states from each other to agree.
	stateStepSlack = 8
)

// stateLimits are the caps on the trainer-state requests a daemon
// answers: streams per peer and in all, and bytes per minute.
type stateLimits struct {
	in     *wire.Inbound
	budget *wire.ByteBudget

	mu   sync.Mutex
	size uint64 // the state's size, as its trainer last gave it
}

func newStateLimits() *stateLimits {
	return &stateLimits{in: wire.NewInbound(1, stateStreams), budget: wire.NewByteBudget(statePeerBudget, stateAllBudget)}
}

// take charges n bytes to p's budget of this minute; false (nothing
// charged) if p's or the node's would be spent.
func (l *stateLimits) take(p peer.ID, n uint64, now time.Time) bool {
	l.mu.Lock()
	unit := max(l.size, stateChunk)
	l.mu.Unlock()
	return l.budget.Take(p, n, unit, now)
}

// settle makes what p was charged (took) what a request cost (cost).
func (l *stateLimits) settle(p peer.ID, took, cost uint64) { l.budget.Settle(p, took, cost) }

// left is how much of the state there is from off, as far as the node
// knows its size (the most a chunk may be, before it does).
func (l *stateLimits) left(off uint64) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.size == 0 {
		return stateChunk
	}
	return l.size - min(off, l.size)
}

// sized records the state's size, as the trainer gave it.
func (l *stateLimits) sized(n uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.size = n
}

// stateMetrics count the trainer-state requests, psp_trainer_state_*.
type stateMetrics struct {
	served  *prometheus.CounterVec
	fetched *prometheus.CounterVec
}

func newStateMetrics(reg prometheus.Registerer) *stateMetrics {
	m := &stateMetrics{
		served: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "psp", Subsystem: "trainer", Name: "state_served_total",
			Help: "Peers' requests for this trainer's state (a joining worker's trainer takes it), by result: ok, none (no trainer or another kind), error, stranger (not a peer of the job's lineage), busy (the peer's or the node's streams at their cap), budget (the peer's or the node's bytes of this minute spent)."}, []string{"result"}),
		fetched: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "psp", Subsystem: "trainer", Name: "state_fetched_total",
			Help: "Requests this daemon made for a peer's trainer state (a session that starts from the job's parameters), by result: ok, error, refused (a state whose step is too far from the job's)."}, []string{"result"}),
	}
	if reg != nil {
		reg.MustRegister(m.served, m.fetched)
	}
	return m
}

// startState serves the job's trainer-state protocol on the node's host.
func (s *Server) startState(reg prometheus.Registerer) {
	s.stm = newStateMetrics(reg)
	s.stateLimit = newStateLimits()
	s.stateProto = StateProtocol(s.drv.Info().Job)
	s.node.Host().SetStreamHandler(s.stateProto, s.handleState)
}

// stopState stops serving it.
func (s *Server) stopState() { s.node.Host().RemoveStreamHandler(s.stateProto) }

// stateTimeout bounds one request for a state, either side: the trainer's
// answer and the transfer.
func (s *Server) stateTimeout() time.Duration { return s.cfg.ParamsTimeout + 10*time.Second }

// handleState answers a peer's request for a range of the trainer's
// state.
func (s *Server) handleState(st network.Stream) {
	p := st.Conn().RemotePeer()
	refuse := func(result string, err error) {
		s.stm.served.WithLabelValues(result).Inc()
		if err != nil {
			s.log.Debug("trainer state not served", "to", p, "result", result, "err", err)
		}
		_ = st.Reset()
	}
	if !s.drv.Member(p) {
		refuse("stranger", nil)
		return
	}
	if !s.stateLimit.in.Acquire(p) {
		refuse("busy", nil)
		return
	}
	defer s.stateLimit.in.Release(p)
	defer st.Close()
	_ = st.SetDeadline(time.Now().Add(s.stateTimeout()))
	r := bufio.NewReader(io.LimitReader(st, 1+binary.MaxVarintLen64+maxStateKind+12))
	kind, off, length, err := readStateRequest(r)
	if err != nil {
		refuse("error", err)
		return
	}
	sess := s.task.session()
	if sess == nil || sess.hello.StateKind != kind {
		refuse("none", nil)
		return
	}
	length = min(length, stateChunk)
	if length == 0 {
		length = stateChunk
	}
	charge := max(min(uint64(length), s.stateLimit.left(off)), stateMinCharge)
	if !s.stateLimit.take(p, charge, time.Now()) {
		refuse("budget", nil)
		return
	}
	ctx, cancel := context.WithTimeout(sess.ctx, s.stateTimeout())
	defer cancel()
	state, err := sess.requestState(ctx, off, length)
	if err != nil {
		s.stateLimit.settle(p, charge, stateMinCharge)
		refuse("error", err)
		return
	}
	s.stateLimit.sized(state.TotalSize)
	s.stateLimit.settle(p, charge, max(uint64(len(state.Data)), stateMinCharge))
	b, err := proto.Marshal(state)
	if err == nil {
		_, err = st.Write(append(binary.AppendUvarint(nil, uint64(len(b))), b...))
	}
	if err != nil {
		refuse("error", err)
		return
	}
	s.stm.served.WithLabelValues("ok").Inc()
}

// appendStateRequest appends a request for length bytes of the state of
// kind from off.
func appendStateRequest(b []byte, kind string, off uint64, length uint32) []byte {
	b = append(b, stateVersion)
	b = binary.AppendUvarint(b, uint64(len(kind)))
	b = append(b, kind...)
	b = binary.BigEndian.AppendUint64(b, off)
	return binary.BigEndian.AppendUint32(b, length)
}

// readStateRequest reads a request: the version, the kind, the range.
func readStateRequest(r *bufio.Reader) (kind string, off uint64, length uint32, err error) {
	v, err := r.ReadByte()
	if err != nil {
		return "", 0, 0, err
	}
	if v != stateVersion {
		return "", 0, 0, fmt.Errorf("trainer-state request version %d, want %d", v, stateVersion)
	}
	n, err := binary.ReadUvarint(r)
	if err != nil {
		return "", 0, 0, err
	}
	if n == 0 || n > maxStateKind {
		return "", 0, 0, fmt.Errorf("trainer-state kind of %d bytes", n)
	}
	b := make([]byte, n+12)
	if _, err := io.ReadFull(r, b); err != nil {
		return "", 0, 0, err
	}
	return string(b[:n]), binary.BigEndian.Uint64(b[n:]), binary.BigEndian.Uint32(b[n+8:]), nil
}

// session is the session whose trainer's updates the task takes (one
// that has started), nil for none.
func (t *RemoteModel) session() *session {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.sess
}

// requestState asks the trainer for length bytes of its state from off
// (ParamsRequest.want_state).
func (sess *session) requestState(ctx context.Context, off uint64, length uint32) (*pb.TrainerState, error) {
	r, err := sess.ask(ctx, &pb.ParamsRequest{WantState: true, StateOffset: off, StateLength: length})
	if err != nil {
		return nil, err
	}
	st := r.State
	switch {
	case st == nil:
		return nil, errors.New("the trainer sent no state")
	case st.Kind != sess.hello.StateKind:
		return nil, fmt.Errorf("the trainer sent state of kind %q, its Hello named %q", st.Kind, sess.hello.StateKind)
	case st.Step < 0:
		return nil, fmt.Errorf("the trainer's state is at step %d", st.Step)
	case st.Offset != off || uint64(len(st.Data)) > uint64(length) && length > 0:
		return nil, fmt.Errorf("the trainer sent %d bytes of its state from %d, asked %d from %d", len(st.Data), st.Offset, length, off)
	case st.TotalSize != 0 && st.Offset+uint64(len(st.Data)) > st.TotalSize:
		return nil, fmt.Errorf("the trainer sent bytes %d to %d of a state of %d", st.Offset, st.Offset+uint64(len(st.Data)), st.TotalSize)
	}
	if st.TotalSize == 0 {
		st.TotalSize = st.Offset + uint64(len(st.Data))
	}
	return st, nil
}

// stateFetch is a state on its way from the job's peers to a joining
// session: the first chunk, chosen among the first chunks of up to
// stateTries peers (fetchState), then the rest, chunk by chunk, from the
// peer that gave it or, when it stops giving them, the next (peers whose
// state agreed with it first).
type stateFetch struct {
	s     *Server
	kind  string
	peers []peer.ID
	from  int // the peer the chunks come from now
	tried int // peers that failed to give a chunk
}

// stateAnswer is one peer's first chunk.
type stateAnswer struct {
	p  peer.ID
	st *pb.TrainerState
}

// agree reports whether two peers' states look like the same job's: the
// same size, steps within stateStepSlack.
func (a stateAnswer) agree(b stateAnswer) bool {
	d := a.st.Step - b.st.Step
	return a.st.TotalSize == b.st.TotalSize && -stateStepSlack <= d && d <= stateStepSlack
}

// fetchState asks the job's peers, in random order, for the first chunk
// of their trainer's state of kind, until two agree or stateTries
// answered: it returns the chosen chunk, which peer gave it, and the fetch
// of the rest (nil: no peer gave a usable one). A state more than
// stateStepSlack steps from step (the job's, as the session starts from
// it) is refused.
func (s *Server) fetchState(ctx context.Context, kind string, step int64) (*pb.TrainerState, string, *stateFetch) {
	peers := s.node.Overlay().Peers()
	rand.Shuffle(len(peers), func(i, j int) { peers[i], peers[j] = peers[j], peers[i] })
	var got []stateAnswer
	var last error = errors.New("no peer to ask")
	asked, pair := 0, -1
	for _, p := range peers {
		if asked >= stateTries || pair >= 0 || ctx.Err() != nil {
			break
		}
		asked++
		st, err := s.askState(ctx, p, kind, 0, stateChunk)
		if err == nil && (st.Step < step-stateStepSlack || st.Step > step+stateStepSlack) {
			s.stm.fetched.WithLabelValues("refused").Inc()
			err = fmt.Errorf("a state at step %d, the job's is %d", st.Step, step)
		} else if err == nil {
			s.stm.fetched.WithLabelValues("ok").Inc()
		} else {
			s.stm.fetched.WithLabelValues("error").Inc()
		}
		if err != nil {
			s.log.Debug("no trainer state from a peer", "peer", p, "err", err)
			last = err
			continue
		}
		a := stateAnswer{p, st}
		for i, b := range got {
			if a.agree(b) {
				pair = i
				break
			}
		}
		got = append(got, a)
	}
	if len(got) == 0 {
		if len(peers) > 0 && ctx.Err() == nil {
			s.log.Warn("no peer gave a usable trainer state: the trainer starts from the job's parameters without it", "kind", kind, "asked", asked, "err", last)
		}
		return nil, "", nil
	}
	// The chosen state: the first of the agreeing pair, or (none agree)
	// the first answer. The rest comes from it, then from the peers that
	// agree with it, then the others.
	chosen := got[0]
	if pair >= 0 {
		chosen = got[pair]
	} else if len(got) > 1 || asked > 1 {
		s.log.Warn("the trainer state is one peer's: no two peers' states agreed", "kind", kind, "answers", len(got), "asked", asked)
	}
	order := []peer.ID{chosen.p}
	seen := map[peer.ID]bool{chosen.p: true}
	for _, b := range got {
		if !seen[b.p] && b.agree(chosen) {
			order, seen[b.p] = append(order, b.p), true
		}
	}
	for _, p := range peers {
		if !seen[p] && !slices.ContainsFunc(got, func(b stateAnswer) bool { return b.p == p }) {
			order, seen[p] = append(order, p), true
		}
	}
	src := "peer " + chosen.p.String()
	if pair >= 0 {
		src += fmt.Sprintf(" (%d peers agree)", len(got))
	}
	return chosen.st, src, &stateFetch{s: s, kind: kind, peers: order}
}

// next fetches the chunk of the state from off, from the peer the chunks
// come from, or the next ones (up to stateTries failures in all).
func (f *stateFetch) next(ctx context.Context, off uint64) (*pb.TrainerState, error) {
	var last error = errors.New("no peer to ask")
	for f.from < len(f.peers) && ctx.Err() == nil {
		p := f.peers[f.from]
		st, err := f.s.askState(ctx, p, f.kind, off, stateChunk)
		if err == nil {
			f.s.stm.fetched.WithLabelValues("ok").Inc()
			return st, nil
		}
		f.s.stm.fetched.WithLabelValues("error").Inc()
		f.s.log.Debug("no trainer state from a peer", "peer", p, "offset", off, "err", err)
		last = err
		if f.tried++; f.tried >= stateTries {
			break
		}
		f.from++
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return nil, last
}

// rest sends the state's chunks after first on the session's stream,
// fetched one at a time; a chunk no peer gives ends it with a failed
// chunk (the trainer then has no state).
func (f *stateFetch) rest(ctx context.Context, sess *session, first *pb.TrainerState) error {
	total, off, step := first.TotalSize, first.Offset+uint64(len(first.Data)), first.Step
	for off < total {
		st, err := f.next(ctx, off)
		if err == nil && (st.TotalSize != total || st.Offset != off || len(st.Data) == 0) {
			err = fmt.Errorf("a chunk from %d of %d bytes, at step %d, of a state of %d from %d", st.Offset, len(st.Data), st.Step, st.TotalSize, off)
		}
		if err != nil {
			f.s.log.Warn("the rest of the trainer state could not be fetched: the trainer starts without it", "kind", f.kind, "fetched", off, "of", total, "err", err)
			return sess.send(&pb.DaemonMessage{Msg: &pb.DaemonMessage_StateChunk{StateChunk: &pb.StateChunk{Offset: off, Failed: true, Error: err.Error()}}})
		}
		if st.Step != step {
			f.s.log.Debug("the trainer state moved on while it was fetched", "from_step", step, "to_step", st.Step, "offset", off)
		}
		if err := sess.send(&pb.DaemonMessage{Msg: &pb.DaemonMessage_StateChunk{StateChunk: &pb.StateChunk{Offset: off, Data: st.Data}}}); err != nil {
			return err
		}
		off += uint64(len(st.Data))
	}
	return nil
}

// askState asks peer p for length bytes of its trainer's state of kind
// from off.
func (s *Server) askState(ctx context.Context, p peer.ID, kind string, off uint64, length uint32) (*pb.TrainerState, error) {
	ctx, cancel := context.WithTimeout(ctx, s.stateTimeout())
	defer cancel()
	st, err := s.node.Host().NewStream(ctx, p, s.stateProto)
	if err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { _ = st.Reset() })
	defer stop()
	deadline, _ := ctx.Deadline()
	_ = st.SetDeadline(deadline)
	if _, err := st.Write(appendStateRequest(nil, kind, off, length)); err != nil {
		_ = st.Reset()
		return nil, err
	}
	_ = st.CloseWrite()
	limit := uint64(length) + 4096
	r := bufio.NewReader(io.LimitReader(st, int64(limit)+binary.MaxVarintLen64))
	n, err := binary.ReadUvarint(r)
	if err != nil {
		_ = st.Reset()
		return nil, fmt.Errorf("reading the state's length: %w", err)
	}
	if n > limit {
		_ = st.Reset()
		return nil, fmt.Errorf("a chunk of %d bytes, beyond the %d asked for", n, length)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		_ = st.Reset()
		return nil, fmt.Errorf("reading the state: %w", err)
	}
	_ = st.Close()
	var out pb.TrainerState
	if err := proto.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("decoding the state: %w", err)
	}
	if out.Kind != kind || out.Step < 0 || out.Offset != off || out.TotalSize < out.Offset+uint64(len(out.Data)) {
		return nil, fmt.Errorf("the peer sent a state of kind %q at step %d, bytes %d to %d of %d; asked for %q from %d",
			out.Kind, out.Step, out.Offset, out.Offset+uint64(len(out.Data)), out.TotalSize, kind, off)
	}
	return &out, nil
}
