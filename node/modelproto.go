package node

import (
	"context"
	"errors"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/internal/wire"
	"github.com/pspnode/pspnode/node/netsetup"
	"github.com/pspnode/pspnode/psp"
)

// The node's side of the model protocol (the messages and their streams
// are package wire's): a joiner fetches the job's model from a peer, and
// every node serves its own.

// ParamSource is implemented by tasks whose parameters take time to get
// or may be unavailable, such as a trainer in another process: the model
// protocol then asks through it, within ctx, instead of Params.
type ParamSource interface {
	ParamsContext(ctx context.Context) ([]float64, error)
}

// shape is the node's model as peers compare it.
func (n *Node) shape() wire.ModelShape {
	return wire.ModelShape{ID: n.model.ModelID(), N: n.model.NumParams()}
}

// fetchModel asks one peer for its model. A peer that runs another model
// is found from the head of its reply: a *ModelMismatchError, whatever the
// size of its model.
func (n *Node) fetchModel(ctx context.Context, p peer.ID) (wire.ModelSnapshot, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*n.cfg.Check.QueryTimeout)
	defer cancel()
	m, err := wire.FetchModel(n.overRelay(ctx), n.h, p, n.cfg.Job, n.shape(), n.cfg.Exchange.MaxAbsValue)
	return m, n.mismatch(p, err)
}

// peekModel asks p for its model and reads only the head of the reply:
// nil if p runs this node's model, a *ModelMismatchError if it runs
// another, or why p did not say.
func (n *Node) peekModel(ctx context.Context, p peer.ID) error {
	ctx, cancel := context.WithTimeout(ctx, n.cfg.Check.QueryTimeout)
	defer cancel()
	return n.mismatch(p, wire.PeekModel(n.overRelay(ctx), n.h, p, n.cfg.Job, n.shape()))
}

// overRelay lets a model stream cross a relay only if the whole model
// fits (netsetup.OverRelay): the answerer writes it all before it sees a
// reset.
func (n *Node) overRelay(ctx context.Context) context.Context {
	return netsetup.OverRelay(ctx, wire.MaxModelFrame(n.model.NumParams()), "model")
}

// mismatch turns wire's model mismatch from p into a *ModelMismatchError;
// other errors pass as they are.
func (n *Node) mismatch(p peer.ID, err error) error {
	var wm *wire.ModelMismatch
	if !errors.As(err, &wm) {
		return err
	}
	return &ModelMismatchError{Peer: p.String(), PeerModel: wm.Theirs.ID, PeerParams: int64(wm.Theirs.N),
		OwnModel: wm.Ours.ID, OwnParams: int64(wm.Ours.N)}
}

// modelSource is the node as its model server sees it (wire.ModelSource).
type modelSource Node

// ModelHead is the node's step and model. A driven node with no model yet
// (before its first trainer), or no trainer to ask, has none: the asker
// tries another peer. (A node whose task has no model answers n = 0.)
func (s *modelSource) ModelHead() (psp.Step, wire.ModelShape, bool) {
	n := (*Node)(s)
	if n.driver != nil && (!n.modelUp.Load() || n.idle.Load()) {
		return 0, wire.ModelShape{}, false
	}
	return n.step.Load(), n.shape(), true
}

// ModelParams are the task's parameters for a peer's model fetch.
func (s *modelSource) ModelParams(ctx context.Context) ([]float64, error) {
	n := (*Node)(s)
	if ps, ok := n.model.(ParamSource); ok {
		return ps.ParamsContext(ctx)
	}
	return n.model.Params(), nil
}

// serveModel is the model protocol's stream handler.
func (n *Node) serveModel(s network.Stream) {
	sv := wire.ModelServer{Life: n.life, Timeout: 10 * n.cfg.Check.QueryTimeout, Source: (*modelSource)(n), Bad: n.m.ModelBad, None: n.m.ModelNone, Log: n.log}
	sv.Serve(s)
}
