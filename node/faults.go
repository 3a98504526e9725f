package node

import (
	"context"
	"time"

	"github.com/pspnode/pspnode/internal/faults"
)

// The testnets' fault hooks (internal/faults) set Config.faults, which is
// not part of the public API, and read what only testnets measure.
func init() {
	faults.SetNode = func(cfg any, f faults.Node) { cfg.(*Config).faults = f }
	faults.SetHost = func(cfg any, h faults.Host) { cfg.(*Config).hostFaults = h }
	faults.Recent = func(nd any) (waits, checks, rtts []float64) { return nd.(*Node).m.Recent() }
	faults.Computing = func(nd any) bool { return nd.(*Node).busy.Load() }
}

// lost draws whether one incoming message is lost under faults.Loss.
func (n *Node) lost() bool {
	if n.cfg.faults.Loss <= 0 {
		return false
	}
	n.rngMu.Lock()
	defer n.rngMu.Unlock()
	return n.rng.Float64() < n.cfg.faults.Loss
}

// sleepCtx sleeps for d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
