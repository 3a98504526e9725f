package node

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/internal/wire"
	"github.com/pspnode/pspnode/node/netsetup"
)

// ModelMismatchError says that a peer runs another model than this node:
// another model ID or parameter count. It is not a malformed message: the
// two nodes must not be in one job.
type ModelMismatchError struct {
	Peer       string // the peer's ID; "" when not known
	PeerModel  uint32
	PeerParams int64
	OwnModel   uint32
	OwnParams  int64
}

func (e *ModelMismatchError) Error() string {
	who := "the peer"
	if e.Peer != "" {
		who = "peer " + e.Peer
	}
	return fmt.Sprintf("model mismatch: %s runs model id %#08x with %d parameters; this node runs model id %#08x with %d",
		who, e.PeerModel, e.PeerParams, e.OwnModel, e.OwnParams)
}

// handleModel sends the current model to a joining peer.
func (n *Node) handleModel(s network.Stream) {
	from := s.Conn().RemotePeer()
	defer s.Close()
	ctx, cancel := context.WithTimeout(n.life, 10*n.cfg.QueryTimeout)
	defer cancel()
	defer guard(ctx, s)()
	_ = s.SetDeadline(time.Now().Add(10 * n.cfg.QueryTimeout))
	body, err := readFrame(smallReader(s, 8), 8)
	if err != nil || len(body) != 1 || body[0] != wireVersion {
		n.m.modelBad.Inc()
		_ = s.Reset()
		return
	}
	if n.driver != nil && (!n.modelUp.Load() || n.idle.Load()) {
		// A driven node with no model yet (before its first trainer), or
		// no trainer to ask: the asker tries another peer. (A node whose
		// task has no model answers n = 0, below.)
		n.m.modelNone.Inc()
		_ = s.Reset()
		return
	}
	// The frame's head (its length, the step, the model ID and the
	// parameter count) goes first: an asker that only checks which model
	// the job runs (peekModel) reads it and goes, without waiting for the
	// parameters, which a trainer in another process may take a while to
	// give.
	step, count := n.step.Load(), n.task.NumParams()
	if _, err := s.Write(modelHead(step, n.task.ModelID(), count)); err != nil {
		_ = s.Reset()
		return
	}
	params, err := n.paramsFor(ctx)
	if err != nil {
		n.m.modelNone.Inc()
		n.log.Debug("model not served", "to", from, "err", err)
		_ = s.Reset()
		return
	}
	if _, err := s.Write(appendParams(make([]byte, 0, 8*count), params)); err != nil {
		_ = s.Reset()
	}
}

// modelHead is the start of a model reply frame of count parameters: the
// frame's length, then the body up to the parameters.
func modelHead(step int64, modelID uint32, count int) []byte {
	b := binary.AppendUvarint(nil, uint64(wire.ModelHeaderLen+8*count))
	b = append(b, wireVersion)
	b = binary.BigEndian.AppendUint64(b, uint64(step))
	b = binary.BigEndian.AppendUint32(b, modelID)
	return binary.BigEndian.AppendUint32(b, uint32(count))
}

// appendParams appends the parameters of a model reply to b.
func appendParams(b []byte, params []float64) []byte {
	for _, v := range params {
		b = binary.BigEndian.AppendUint64(b, math.Float64bits(v))
	}
	return b
}

// peekModel asks p for its model and reads only the head of the reply:
// nil if p runs this node's model, a *ModelMismatchError if it runs
// another, or why p did not say.
func (n *Node) peekModel(ctx context.Context, p peer.ID) error {
	ctx, cancel := context.WithTimeout(ctx, n.cfg.QueryTimeout)
	defer cancel()
	// The answerer writes its whole model before it sees the reset: the
	// stream may cross a relay only if the whole model fits (netsetup.OverRelay).
	s, err := n.h.NewStream(netsetup.OverRelay(ctx, wire.MaxModelFrame(n.task.NumParams()), "model"), p, n.modelID)
	if err != nil {
		return err
	}
	defer s.Reset() // the parameters are not wanted
	defer guard(ctx, s)()
	deadline, _ := ctx.Deadline()
	_ = s.SetDeadline(deadline)
	if err := writeFrame(s, []byte{wireVersion}); err != nil {
		return err
	}
	_ = s.CloseWrite()
	_, err = n.readModelHead(bufio.NewReaderSize(s, 32), p)
	return err
}

// ParamSource is implemented by tasks whose parameters take time to get
// or may be unavailable, such as a trainer in another process: the model
// protocol then asks through it, within ctx, instead of Params.
type ParamSource interface {
	ParamsContext(ctx context.Context) ([]float64, error)
}

// paramsFor returns the task's parameters for a peer's model fetch.
func (n *Node) paramsFor(ctx context.Context) ([]float64, error) {
	var p []float64
	if ps, ok := n.task.(ParamSource); ok {
		var err error
		if p, err = ps.ParamsContext(ctx); err != nil {
			return nil, err
		}
	} else {
		p = n.task.Params()
	}
	if len(p) != n.task.NumParams() {
		return nil, fmt.Errorf("the task gave %d parameters, its model has %d", len(p), n.task.NumParams())
	}
	return p, nil
}

// fetchModel asks one peer for its model. A peer that runs another model
// is found from the head of its reply: a *ModelMismatchError, whatever the
// size of its model.
func (n *Node) fetchModel(ctx context.Context, p peer.ID) (wire.ModelSnapshot, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*n.cfg.QueryTimeout)
	defer cancel()
	s, err := n.h.NewStream(netsetup.OverRelay(ctx, wire.MaxModelFrame(n.task.NumParams()), "model"), p, n.modelID)
	if err != nil {
		return wire.ModelSnapshot{}, err
	}
	defer guard(ctx, s)()
	deadline, _ := ctx.Deadline()
	_ = s.SetDeadline(deadline)
	if err := writeFrame(s, []byte{wireVersion}); err != nil {
		_ = s.Reset()
		return wire.ModelSnapshot{}, err
	}
	_ = s.CloseWrite()
	limit := wire.MaxModelFrame(n.task.NumParams())
	r := bufio.NewReader(io.LimitReader(s, int64(limit)+binary.MaxVarintLen64))
	snap, err := n.readModelHead(r, p)
	if err != nil {
		_ = s.Reset()
		return wire.ModelSnapshot{}, err
	}
	body, err := readBody(r, 8*n.task.NumParams())
	if err != nil {
		_ = s.Reset()
		return wire.ModelSnapshot{}, err
	}
	_ = s.Close()
	snap.Params = make([]float64, n.task.NumParams())
	for i := range snap.Params {
		v := math.Float64frombits(binary.BigEndian.Uint64(body[8*i:]))
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return wire.ModelSnapshot{}, fmt.Errorf("%w: parameter %d is %v", ErrWire, i, v)
		}
		if bound := n.cfg.Gossip.MaxAbsValue; bound > 0 && math.Abs(v) > bound {
			// No honest model has it: updates and models beyond the
			// bound are refused by every receiver.
			return wire.ModelSnapshot{}, fmt.Errorf("%w: parameter %d is %v, beyond the exchange's bound of ±%v", ErrWire, i, v, bound)
		}
		snap.Params[i] = v
	}
	return snap, nil
}

// readModelHead reads the head of a model reply from p: the frame's
// length, the version, the step, the model ID and the parameter count,
// which must be this node's.
func (n *Node) readModelHead(r *bufio.Reader, p peer.ID) (wire.ModelSnapshot, error) {
	size, err := binary.ReadUvarint(r)
	if err != nil {
		return wire.ModelSnapshot{}, fmt.Errorf("%w: model reply length: %w", ErrWire, err)
	}
	head := make([]byte, wire.ModelHeaderLen)
	if _, err := io.ReadFull(r, head); err != nil {
		return wire.ModelSnapshot{}, fmt.Errorf("%w: model reply head: %w", ErrWire, err)
	}
	if head[0] != wireVersion {
		return wire.ModelSnapshot{}, fmt.Errorf("%w: model reply version %d, want %d", ErrWire, head[0], wireVersion)
	}
	snap := wire.ModelSnapshot{Step: int64(binary.BigEndian.Uint64(head[1:])), ModelID: binary.BigEndian.Uint32(head[9:])}
	count := binary.BigEndian.Uint32(head[13:])
	own := n.task.NumParams()
	switch {
	case snap.Step < 0:
		return wire.ModelSnapshot{}, fmt.Errorf("%w: negative step %d", ErrWire, snap.Step)
	case snap.ModelID != n.task.ModelID() || int64(count) != int64(own):
		return wire.ModelSnapshot{}, &ModelMismatchError{Peer: p.String(), PeerModel: snap.ModelID, PeerParams: int64(count), OwnModel: n.task.ModelID(), OwnParams: int64(own)}
	case size != uint64(wire.ModelHeaderLen)+8*uint64(count):
		return wire.ModelSnapshot{}, fmt.Errorf("%w: model reply of %d bytes for %d parameters", ErrWire, size, count)
	}
	return snap, nil
}
