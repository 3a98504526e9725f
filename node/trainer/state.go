package trainer

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	pb "github.com/pspnode/pspnode/node/trainer/trainerpb"
)

// Trainer state: what a trainer keeps beside its parameters that a
// joining worker's trainer needs as well (a DiLoCo trainer's outer
// parameters and outer momentum). The node's model protocol carries the
// parameters only; the state travels over a protocol of its own, served by
// this package and opaque to it:
//
//   - a trainer names the kind of state it keeps in Hello.state_kind;
//   - a peer's daemon asked for the state (StateProtocol) asks its trainer
//     (ParamsRequest.want_state) and answers with the trainer's
//     TrainerState, if its kind is the asker's;
//   - a session whose Hello names a kind and that starts from the job's
//     parameters (the job is ahead) gets a peer's state in Welcome.
//
// A request is one byte, stateVersion, then the kind asked for (a
// uvarint length and its bytes); the answer is a uvarint length and a
// marshalled TrainerState, or a stream reset for none.

// StateProtocol is the protocol ID of job's trainer-state protocol.
func StateProtocol(job string) protocol.ID {
	return protocol.ID("/psp/" + job + "/trainer-state/1.0.0")
}

const (
	stateVersion = 1
	// maxStateKind bounds Hello.state_kind and TrainerState.kind.
	maxStateKind = 256
	// stateTries is how many peers a joining session asks for a state.
	stateTries = 4
)

// stateMetrics count the trainer-state requests, psp_trainer_state_*.
type stateMetrics struct {
	served  *prometheus.CounterVec
	fetched *prometheus.CounterVec
}

func newStateMetrics(reg prometheus.Registerer) *stateMetrics {
	m := &stateMetrics{
		served: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "psp", Subsystem: "trainer", Name: "state_served_total",
			Help: "Peers' requests for this trainer's state (a joining worker's trainer takes it), by result: ok, none (no trainer or another kind), error."}, []string{"result"}),
		fetched: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "psp", Subsystem: "trainer", Name: "state_fetched_total",
			Help: "Requests this daemon made for a peer's trainer state (a session that starts from the job's parameters), by result: ok, error."}, []string{"result"}),
	}
	if reg != nil {
		reg.MustRegister(m.served, m.fetched)
	}
	return m
}

// startState serves the job's trainer-state protocol on the node's host.
func (s *Server) startState(reg prometheus.Registerer) {
	s.stm = newStateMetrics(reg)
	s.stateProto = StateProtocol(s.drv.Info().Job)
	s.node.Host().SetStreamHandler(s.stateProto, s.handleState)
}

// stopState stops serving it.
func (s *Server) stopState() { s.node.Host().RemoveStreamHandler(s.stateProto) }

// stateTimeout bounds one request for a state, either side: the trainer's
// answer and the transfer.
func (s *Server) stateTimeout() time.Duration { return s.cfg.ParamsTimeout + 10*time.Second }

// handleState answers a peer's request for the trainer's state.
func (s *Server) handleState(st network.Stream) {
	defer st.Close()
	_ = st.SetDeadline(time.Now().Add(s.stateTimeout()))
	r := bufio.NewReader(io.LimitReader(st, 1+binary.MaxVarintLen64+maxStateKind))
	kind, err := readStateRequest(r)
	if err != nil {
		s.stm.served.WithLabelValues("error").Inc()
		s.log.Debug("bad trainer-state request", "from", st.Conn().RemotePeer(), "err", err)
		_ = st.Reset()
		return
	}
	sess := s.task.session()
	if sess == nil || sess.hello.StateKind != kind {
		s.stm.served.WithLabelValues("none").Inc()
		_ = st.Reset()
		return
	}
	ctx, cancel := context.WithTimeout(sess.ctx, s.stateTimeout())
	defer cancel()
	state, err := sess.requestState(ctx)
	if err != nil {
		s.stm.served.WithLabelValues("error").Inc()
		s.log.Debug("trainer state not served", "to", st.Conn().RemotePeer(), "err", err)
		_ = st.Reset()
		return
	}
	b, err := proto.Marshal(state)
	if err == nil {
		_, err = st.Write(append(binary.AppendUvarint(nil, uint64(len(b))), b...))
	}
	if err != nil {
		s.stm.served.WithLabelValues("error").Inc()
		_ = st.Reset()
		return
	}
	s.stm.served.WithLabelValues("ok").Inc()
}

// readStateRequest reads a request: the version, then the kind.
func readStateRequest(r *bufio.Reader) (string, error) {
	v, err := r.ReadByte()
	if err != nil {
		return "", err
	}
	if v != stateVersion {
		return "", fmt.Errorf("trainer-state request version %d, want %d", v, stateVersion)
	}
	n, err := binary.ReadUvarint(r)
	if err != nil {
		return "", err
	}
	if n == 0 || n > maxStateKind {
		return "", fmt.Errorf("trainer-state kind of %d bytes", n)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return "", err
	}
	return string(b), nil
}

// session is the session whose trainer's updates the task takes (one
// that has started), nil for none.
func (t *Model) session() *session {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.sess
}

// requestState asks the trainer for its state (ParamsRequest.want_state).
func (sess *session) requestState(ctx context.Context) (*pb.TrainerState, error) {
	r, err := sess.ask(ctx, true)
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
	}
	return st, nil
}

// fetchState asks up to stateTries of the job's peers, in random order,
// for their trainer's state of kind, and returns the first one given and
// which peer gave it; nil when none did.
func (s *Server) fetchState(ctx context.Context, kind string) (*pb.TrainerState, string) {
	peers := s.node.Overlay().Peers()
	rand.Shuffle(len(peers), func(i, j int) { peers[i], peers[j] = peers[j], peers[i] })
	for _, p := range peers[:min(len(peers), stateTries)] {
		st, err := s.askState(ctx, p, kind)
		if err == nil {
			s.stm.fetched.WithLabelValues("ok").Inc()
			return st, "peer " + p.String()
		}
		if ctx.Err() != nil {
			return nil, ""
		}
		s.stm.fetched.WithLabelValues("error").Inc()
		s.log.Debug("no trainer state from a peer", "peer", p, "err", err)
	}
	if len(peers) > 0 {
		s.log.Warn("no peer gave its trainer's state: the trainer starts from the job's parameters without it", "kind", kind, "asked", min(len(peers), stateTries))
	}
	return nil, ""
}

// askState asks peer p for its trainer's state of kind.
func (s *Server) askState(ctx context.Context, p peer.ID, kind string) (*pb.TrainerState, error) {
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
	req := append([]byte{stateVersion}, binary.AppendUvarint(nil, uint64(len(kind)))...)
	if _, err := st.Write(append(req, kind...)); err != nil {
		_ = st.Reset()
		return nil, err
	}
	_ = st.CloseWrite()
	limit := uint64(s.cfg.MaxMessageBytes)
	r := bufio.NewReader(io.LimitReader(st, int64(limit)+binary.MaxVarintLen64))
	n, err := binary.ReadUvarint(r)
	if err != nil {
		_ = st.Reset()
		return nil, fmt.Errorf("reading the state's length: %w", err)
	}
	if n > limit {
		_ = st.Reset()
		return nil, fmt.Errorf("a state of %d bytes, beyond the bound of %d (--trainer-max-message)", n, limit)
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
	if out.Kind != kind || out.Step < 0 {
		return nil, fmt.Errorf("the peer sent a state of kind %q at step %d, asked for %q", out.Kind, out.Step, kind)
	}
	return &out, nil
}
