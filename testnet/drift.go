package testnet

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/gossip"
	"github.com/pspnode/pspnode/internal/wire"
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
func (t *testnet) drift(ctx context.Context, m *member) {
	var wg sync.WaitGroup
	for _, p := range m.nd.Overlay().Peers() {
		if _, hostile := t.roleOf.Load(p); hostile {
			continue
		}
		wg.Go(func() { t.driftAt(ctx, m, p) })
	}
	wg.Wait()
}

// driftAt pushes poisoned models at one victim: fetch its model, push it
// moved by dist along (1, …, 1)/√n, and fit dist to what the victim takes.
func (t *testnet) driftAt(ctx context.Context, m *member, victim peer.ID) {
	task := m.nd.Model()
	n, modelID := task.NumParams(), task.ModelID()
	maxAbs := driftMaxAbs * gossip.DefaultConfig().MaxAbsValue
	dist := driftStart * math.Sqrt(float64(n))
	backoff := driftBackoffMin
	h := m.nd.Host()
	for ctx.Err() == nil {
		step, params, err := fetchModelT(ctx, h, victim, modelID, n)
		if err != nil {
			t.hostile.driftOther.Add(1)
			sleepCtx(ctx, driftBackoffMax)
			continue
		}
		t.hostile.driftModelsFetched.Add(1)
		shift := dist / math.Sqrt(float64(n))
		for i, v := range params {
			params[i] = max(-maxAbs, min(maxAbs, v+shift))
		}
		status, err := pushModelT(ctx, h, victim, step, modelID, params)
		t.hostile.driftPushes.Add(1)
		switch {
		case err != nil:
			t.hostile.driftOther.Add(1)
			sleepCtx(ctx, driftBackoffMax)
		case status == "":
			t.hostile.driftTaken.Add(1)
			dist *= driftGrow
			backoff = driftBackoffMin
			sleepCtx(ctx, floodPause)
		case status == wire.ReasonDistance:
			t.hostile.driftDistance.Add(1)
			dist *= driftShrink
			sleepCtx(ctx, floodPause)
		case status == wire.ReasonRate:
			t.hostile.driftRate.Add(1)
			sleepCtx(ctx, backoff)
			backoff = min(2*backoff, driftBackoffMax)
		default:
			t.hostile.driftOther.Add(1)
			sleepCtx(ctx, driftBackoffMax)
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
