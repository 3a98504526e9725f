package hostile

import (
	"context"
	"math"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/gossip"
	"github.com/pspnode/pspnode/internal/vclock"
	"github.com/pspnode/pspnode/internal/wire"
	"github.com/pspnode/pspnode/node"
	"github.com/pspnode/pspnode/node/exchange"
)

// The drift-poison role's campaign (see DriftPoison): models fetched from
// each honest peer and pushed back moved one way.

// driftFactor and driftMaxAbs shape a drift-poison node's pushes: the
// distance grows by driftGrow after a model taken and shrinks by
// driftShrink after one refused for distance; values stay within
// driftMaxAbs × the receivers' MaxAbsValue.
const (
	driftGrow   = 1.5
	driftShrink = 0.6
	driftMaxAbs = 0.9
	// driftStart is the first distance tried, per unit of parameter count's
	// square root.
	driftStart = 1e-3
	// driftBackoffMin and driftBackoffMax bound the wait after a refusal
	// for rate (the peer has taken its share until its next average).
	driftBackoffMin = 20 * time.Millisecond
	driftBackoffMax = time.Second
)

// drift is a drift-poison node's campaign, until ctx ends: one worker for
// each honest peer its overlay knows when training starts.
func (p *Play) drift(ctx context.Context, nd *node.Node) {
	p.eachHonestPeer(nd, func(q peer.ID) { p.driftAt(ctx, nd, q) })
}

// driftAt pushes poisoned models at one victim: fetch its model, push it
// moved by dist along (1, …, 1)/√n, and fit dist to what the victim takes.
func (p *Play) driftAt(ctx context.Context, nd *node.Node, victim peer.ID) {
	task := nd.Model()
	n, modelID := task.NumParams(), task.ModelID()
	maxAbs := driftMaxAbs * gossip.DefaultConfig().MaxAbsValue
	dist := driftStart * math.Sqrt(float64(n))
	backoff := driftBackoffMin
	h := nd.Host()
	for ctx.Err() == nil {
		step, params, err := fetchModelT(ctx, h, victim, modelID, n)
		if err != nil {
			p.counts.driftOther.Add(1)
			vclock.Sleep(ctx, driftBackoffMax)
			continue
		}
		p.counts.driftModelsFetched.Add(1)
		shift := dist / math.Sqrt(float64(n))
		for i, v := range params {
			params[i] = max(-maxAbs, min(maxAbs, v+shift))
		}
		status, err := pushModelT(ctx, h, victim, step, modelID, params)
		p.counts.driftPushes.Add(1)
		switch {
		case err != nil:
			p.counts.driftOther.Add(1)
			vclock.Sleep(ctx, driftBackoffMax)
		case status == "":
			p.counts.driftTaken.Add(1)
			dist *= driftGrow
			backoff = driftBackoffMin
			vclock.Sleep(ctx, floodPause)
		case status == wire.ReasonDistance:
			p.counts.driftDistance.Add(1)
			dist *= driftShrink
			vclock.Sleep(ctx, floodPause)
		case status == wire.ReasonRate:
			p.counts.driftRate.Add(1)
			vclock.Sleep(ctx, backoff)
			backoff = min(2*backoff, driftBackoffMax)
		default:
			p.counts.driftOther.Add(1)
			vclock.Sleep(ctx, driftBackoffMax)
		}
	}
}

// fetchModelT asks p for its model over the model protocol.
func fetchModelT(ctx context.Context, h host.Host, p peer.ID, modelID uint32, n int) (int64, []float64, error) {
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	v := make([]float32, n)
	step, _, err := wire.FetchBlocks(sctx, h, p, "testnet", wire.ModelShape{ID: modelID, N: n}, 0, wire.Blocks(n), v, 0, 5*time.Second)
	params := make([]float64, n)
	for i, x := range v {
		params[i] = float64(x)
	}
	return step, params, err
}

// pushModelT offers params to p as an epidemic model (at step) and sends
// it if p takes it; it returns why p refused it ("" when it took it).
func pushModelT(ctx context.Context, h host.Host, p peer.ID, step int64, modelID uint32, params []float64) (gossip.Reason, error) {
	n := len(params)
	o := wire.Offer{Kind: byte(exchange.Epidemic), Encoding: wire.EncodingFloat32, Step: step, ModelID: modelID, N: uint32(n),
		Block: wire.ExchangeBlock, Count: uint32(wire.Blocks(n))}
	fill := func(b int, dst []float32) {
		lo, _ := wire.BlockRange(b, n)
		for i := range dst {
			dst[i] = float32(params[lo+i])
		}
	}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	reason, _, _, err := wire.SendModel(sctx, h, p, "testnet", o, fill, nil, 5*time.Second)
	return reason, err
}
