package trainer

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/internal/wire"
	"github.com/pspnode/pspnode/node"
)

// A daemon's model is fixed by its first trainer, and stays until the
// daemon stops: the node builds its exchange for it. So the first trainer's
// model is checked against the job before it is fixed: a trainer of
// another model than the job's must be refused without leaving its model
// behind, or the job's model would then be refused by this daemon too.
// The node checks the job's model again in Driver.Begin, once the model is
// fixed; this check only decides whether to fix it.

// peekTimeout bounds one peer's answer to the model check.
const peekTimeout = 2 * time.Second

// peekPeers is how many of the job's peers the check asks at most, all at
// once, for the first that says which model it runs.
const peekPeers = 4

// checkJobModel waits until the node has joined its job (reporting why
// not, as Begin does), then asks up to peekPeers of the job's peers at
// once which model they run: the head of a model reply, each within
// peekTimeout. The first that says decides: nil if it runs (id, n), a
// *node.ModelMismatchError if not. Peers that do not say (a daemon
// without a trainer resets the stream) are skipped, and nil is returned
// when none says. (One after another, the peers of a job whose daemons
// had no trainer yet each cost a round trip of the session's start.)
func (s *Server) checkJobModel(ctx context.Context, id uint32, n int, report func(string, time.Duration)) error {
	start := time.Now()
	next := start.Add(2 * time.Second)
	for s.drv.Ready() != nil {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if now := time.Now(); !now.Before(next) {
			if err := s.drv.Ready(); err != nil {
				report(err.Error(), now.Sub(start))
			}
			next = now.Add(2 * time.Second)
		}
	}
	peers := s.node.Overlay().Peers()
	rand.Shuffle(len(peers), func(i, j int) { peers[i], peers[j] = peers[j], peers[i] })
	peers = peers[:min(len(peers), peekPeers)]
	type said struct {
		p   peer.ID
		id  uint32
		n   int64
		err error
	}
	pctx, cancel := context.WithCancel(ctx)
	defer cancel() // the peeks still running end with it
	out := make(chan said, len(peers))
	for _, p := range peers {
		go func() { // ends within peekTimeout, or when the check ends
			pid, pn, err := s.peekModel(pctx, p)
			out <- said{p, pid, pn, err}
		}()
	}
	for range peers {
		a := <-out
		if a.err != nil {
			s.log.Debug("model check: the peer did not say", "peer", a.p, "err", a.err)
			continue
		}
		if a.id != id || a.n != int64(n) {
			return &node.ModelMismatchError{Peer: a.p.String(), PeerModel: a.id, PeerParams: a.n, OwnModel: id, OwnParams: int64(n)}
		}
		return nil
	}
	return ctx.Err()
}

// peekModel asks p for the head of its model's reply (the model
// protocol, docs/protocols.md): the model ID and the parameter count.
func (s *Server) peekModel(ctx context.Context, p peer.ID) (id uint32, n int64, err error) {
	ctx, cancel := context.WithTimeout(ctx, peekTimeout)
	defer cancel()
	// Asked as the reader of a model of no parameters: any model the peer
	// runs is "another", and its shape comes back in the mismatch.
	_, err = wire.PeekModel(ctx, s.node.Host(), p, s.drv.Info().Job, wire.ModelShape{})
	var mm *wire.ModelMismatch
	if errors.As(err, &mm) {
		return mm.Theirs.ID, int64(mm.Theirs.N), nil
	}
	if err == nil {
		err = errors.New("the peer runs a model of no parameters")
	}
	return 0, 0, err
}
