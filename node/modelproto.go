package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/internal/wire"
	"github.com/pspnode/pspnode/node/netsetup"
	"github.com/pspnode/pspnode/node/status"
	"github.com/pspnode/pspnode/psp"
)

// The node's side of the model protocol (the messages and their streams
// are package wire's): a joiner fetches the job's model from its peers,
// block ranges from several at once, and every node serves its own.

// ParamSource is implemented by tasks whose parameters take time to get
// or may be unavailable, such as a trainer in another process: the model
// protocol then asks through it, within ctx, instead of Params.
type ParamSource interface {
	ParamsContext(ctx context.Context) ([]float64, error)
}

// ParamSource32 is a ParamSource that gives its parameters as float32,
// in a vector the caller only reads: the model protocol serves them as
// they are, with no copy of its own.
type ParamSource32 interface {
	Params32Context(ctx context.Context) ([]float32, error)
}

// shape is the node's model as peers compare it.
func (mp *modelProto) shape() wire.ModelShape {
	return wire.ModelShape{ID: mp.model.ModelID(), N: mp.model.NumParams()}
}

// fetchPeers is how many peers a joiner fetches the model from at once:
// a large model comes in ranges from each, so that the joiner's link, not
// one peer's upload, sets the pace. fetchRange is the blocks (of
// wire.ExchangeBlock values, 1 MiB) one request asks for. (Variables for
// tests.)
var fetchPeers, fetchRange = 4, 16

// fetchFailures is how many peers may fail (not for running another
// model) before a fetch gives up.
const fetchFailures = 3

// fetchProgressKey carries, in a fetch's context, what to tell of a long
// fetch's progress (withFetchProgress).
type fetchProgressKey struct{}

// withFetchProgress has a model fetch under ctx call progress with a line
// on how far it is, every fetchProgressEvery while it lasts (a session's
// Begin tells its trainer, as it tells why it waits).
func withFetchProgress(ctx context.Context, progress func(string)) context.Context {
	return context.WithValue(ctx, fetchProgressKey{}, progress)
}

// fetchProgressEvery is how often a long fetch says how far it is.
const fetchProgressEvery = 5 * time.Second

// fetched is what fetch got: the model into dst, the step of the
// peer nearest the front of the list that gave a part of it, and who
// gave it.
type fetched struct {
	step  psp.Step
	from  peer.ID
	peers int // peers that gave a part
	// block is one block each peer that gave a part gave (the first of
	// its first range), for the cross-check (crosscheck.go).
	block map[peer.ID]int
}

// fetch fetches the node's model from peers, in ranges of fetchRange
// blocks, from up to fetchPeers of them at once, in their order: a range
// that a peer does not finish (its stream breaks or stalls past a block's
// deadline, or a block is malformed) goes to another peer from the block
// it stopped at, and that peer is dropped. A peer that runs another model
// is held out (mismatches lists them) and does not count as a failure. It
// fails when every peer failed or fetchFailures did, or ctx ends.
func (mp *modelProto) fetch(ctx context.Context, peers []peer.ID, dst []float32) (f fetched, mismatches []*ModelMismatchError, err error) {
	ours := mp.shape()
	if len(dst) != ours.N {
		return f, nil, fmt.Errorf("node: a destination of %d values for a model of %d", len(dst), ours.N)
	}
	ctx = mp.overRelay(ctx)
	wait := 10 * mp.timeout
	nb := wire.Blocks(ours.N)
	type span struct{ first, count int }
	var (
		mu      sync.Mutex
		todo    []span
		left    = nb
		next    int // the next peer of peers to start
		failed  int
		lastErr = errors.New("no peer answered")
		gave    = map[int]psp.Step{} // index in peers -> its step, for those that gave blocks
		first   = map[int]int{}      // index in peers -> the first block it gave
	)
	for b := 0; b < nb; b += fetchRange {
		todo = append(todo, span{b, min(fetchRange, nb-b)})
	}
	var wg sync.WaitGroup
	var start func()
	cond := sync.NewCond(&mu)
	working := 0 // workers with a range in hand
	// worker fetches ranges from peers[i] until none is left or the peer
	// fails; a worker that fails gives its range's rest back and starts
	// the next peer. A worker without a range waits while another has
	// one: that one may give part of it back.
	worker := func(i int) {
		defer wg.Done()
		p := peers[i]
		mu.Lock()
		defer mu.Unlock()
		for {
			for len(todo) == 0 && working > 0 && ctx.Err() == nil {
				cond.Wait()
			}
			if len(todo) == 0 || ctx.Err() != nil {
				cond.Broadcast()
				return
			}
			sp := todo[len(todo)-1]
			todo = todo[:len(todo)-1]
			working++
			mu.Unlock()
			step, taken, err := wire.FetchBlocks(ctx, mp.h, p, mp.job, ours, sp.first, sp.count, dst, mp.maxAbs, wait)
			mu.Lock()
			working--
			left -= taken
			if taken > 0 {
				if _, ok := gave[i]; !ok {
					gave[i], first[i] = step, sp.first
				}
			}
			if err == nil {
				cond.Broadcast()
				continue
			}
			todo = append(todo, span{sp.first + taken, sp.count - taken})
			var mm *ModelMismatchError
			if errors.As(mp.mismatch(p, err), &mm) {
				mismatches = append(mismatches, mm)
			} else {
				failed++
				lastErr = err
				mp.log.Debug("model fetch from a peer failed", "peer", p, "blocks", sp.count, "taken", taken, "err", err)
			}
			if failed < fetchFailures {
				start()
			}
			cond.Broadcast()
			return
		}
	}
	// start starts the next peer's worker; mu is held.
	start = func() {
		if next < len(peers) && ctx.Err() == nil {
			wg.Add(1)
			go worker(next) // ends when the ranges are done, or its peer fails
			next++
		}
	}
	stop := context.AfterFunc(ctx, func() { // wake the waiting workers
		mu.Lock()
		cond.Broadcast()
		mu.Unlock()
	})
	defer stop()
	mu.Lock()
	for range min(fetchPeers, len(peers)) {
		start()
	}
	mu.Unlock()
	// A long fetch says how far it is: to its session's trainer when
	// there is one, in the log otherwise.
	say, _ := ctx.Value(fetchProgressKey{}).(func(string))
	began := time.Now()
	tick := time.NewTicker(fetchProgressEvery)
	defer tick.Stop()
	fetching := make(chan struct{})
	go func() { // ends when the workers have
		wg.Wait()
		close(fetching)
	}()
	for done := false; !done; {
		select {
		case <-fetching:
			done = true
		case <-tick.C:
			mu.Lock()
			got := nb - left
			peersNow := len(gave)
			mu.Unlock()
			el := time.Since(began).Seconds()
			line := fmt.Sprintf("fetching the job's model: %d of %d MiB from %d peers (%.1f MiB/s)", got*4*wire.ExchangeBlock>>20, 4*ours.N>>20, peersNow, float64(got*4*wire.ExchangeBlock)/(1<<20)/el)
			if say != nil {
				say(line)
			} else {
				mp.log.Info(line)
			}
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if left > 0 {
		switch {
		case ctx.Err() != nil:
			return f, mismatches, ctx.Err()
		case failed == 0 && len(mismatches) > 0:
			return f, mismatches, mismatches[0]
		}
		return f, mismatches, fmt.Errorf("%d of %d blocks of the model not fetched: %w", left, nb, lastErr)
	}
	f.peers = len(gave)
	f.block = make(map[peer.ID]int, len(gave))
	for i, b := range first {
		f.block[peers[i]] = b
	}
	for i := range peers {
		if s, ok := gave[i]; ok {
			f.step, f.from = s, peers[i]
			break
		}
	}
	return f, mismatches, nil
}

// peek asks p for the head of its model's reply alone: nil if p runs
// this node's model, a *ModelMismatchError if it runs another, or why p
// did not say.
func (mp *modelProto) peek(ctx context.Context, p peer.ID) error {
	ctx, cancel := context.WithTimeout(ctx, mp.timeout)
	defer cancel()
	_, err := wire.PeekModel(mp.overRelay(ctx), mp.h, p, mp.job, mp.shape())
	return mp.mismatch(p, err)
}

// overRelay lets a model stream cross a relay only if a range fits
// (netsetup.OverRelay): the answerer writes it all before it sees a
// reset.
func (mp *modelProto) overRelay(ctx context.Context) context.Context {
	return netsetup.OverRelay(ctx, 4*min(mp.model.NumParams(), fetchRange*wire.ExchangeBlock), "model")
}

// mismatch turns wire's model mismatch from p into a *ModelMismatchError;
// other errors pass as they are.
func (mp *modelProto) mismatch(p peer.ID, err error) error {
	var wm *wire.ModelMismatch
	if !errors.As(err, &wm) {
		return err
	}
	return &ModelMismatchError{Peer: p.String(), PeerModel: wm.Theirs.ID, PeerParams: int64(wm.Theirs.N),
		OwnModel: wm.Ours.ID, OwnParams: int64(wm.Ours.N)}
}

// modelProto is the node's side of the model protocol (the messages and
// their streams are package wire's): it serves the node's model block by
// block, within a byte budget, and fetches the job's from peers.
type modelProto struct {
	h       host.Host
	job     string
	timeout time.Duration // the step query timeout: a model stream's is 10 times it
	maxAbs  float64       // the bound on a fetched value (Exchange.MaxAbsValue)
	model   Model
	life    context.Context
	m       *status.Metrics
	log     *slog.Logger
	src     *modelSource     // what it serves
	budget  *wire.ByteBudget // the model bytes served a minute
	in      *wire.Inbound    // the inbound model streams (apart from step streams: slow model streams must not crowd out step queries)
}

// modelSource is the node as its model server sees it (wire.ModelSource).
type modelSource struct {
	n *Node
	// The task's parameters as float32, kept for the blocks of the
	// node's step (a task that has them only whole: a built-in task, a
	// trainer under gossip, whose vector this is, read only); an
	// exchange that holds the model (epidemic) serves its blocks as they
	// are.
	mu     sync.Mutex
	at     psp.Step
	params []float32
}

// ModelHead is the node's step and model. A driven node with no model yet
// (before its first trainer), or no trainer to ask, has none: the asker
// tries another peer. (A node whose task has no model answers n = 0.)
func (s *modelSource) ModelHead() (psp.Step, wire.ModelShape, bool) {
	n := s.n
	if n.driver != nil && (!n.modelUp.Load() || n.idle.Load()) {
		return 0, wire.ModelShape{}, false
	}
	return n.step.Load(), n.mp.shape(), true
}

// ReadModel writes the values [lo, hi) of the node's model into dst: from
// the exchange's model when it holds one, else from the task's parameters.
func (s *modelSource) ReadModel(ctx context.Context, lo, hi int, dst []float32) error {
	n := s.n
	if n.exch().ReadModel(lo, hi, dst) {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if step := n.step.Load(); s.params == nil || s.at != step {
		s.params = nil // not kept while the next is made
		var p []float32
		switch ps := n.model.(type) {
		case ParamSource32:
			var err error
			if p, err = ps.Params32Context(ctx); err != nil {
				return err
			}
		case ParamSource:
			p64, err := ps.ParamsContext(ctx)
			if err != nil {
				return err
			}
			p = to32(p64)
		default:
			p = to32(n.model.Params())
		}
		s.params, s.at = p, step
	}
	if hi > len(s.params) || lo < 0 || lo > hi {
		return fmt.Errorf("the task gave %d parameters, the model has %d", len(s.params), n.model.NumParams())
	}
	copy(dst, s.params[lo:hi])
	return nil
}

// to32 is v as float32.
func to32(v []float64) []float32 {
	out := make([]float32, len(v))
	for i, x := range v {
		out[i] = float32(x)
	}
	return out
}

// serve is the model protocol's stream handler.
func (mp *modelProto) serve(s network.Stream) {
	sv := wire.ModelServer{Life: mp.life, Timeout: 10 * mp.timeout, Source: mp.src, Budget: mp.budget,
		Bad: mp.m.ModelBad, None: mp.m.ModelNone, Over: mp.m.ModelBudget, Log: mp.log}
	sv.Serve(s)
}
