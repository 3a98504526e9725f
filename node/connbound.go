package node

import (
	"context"
	"time"

	"github.com/libp2p/go-libp2p/core/host"

	"github.com/pspnode/pspnode/internal/vclock"
	"github.com/pspnode/pspnode/node/netsetup"
	"github.com/pspnode/pspnode/node/status"
)

// The node bounds its connections (Config.Limits.BoundConns: at most ConnHigh,
// trimmed to ConnLow) and guards the last quarter of a built host's
// inbound limit; how, and why, is in netsetup's limits.go.

// connGuard bounds a node's connections: the trimming loop and the
// inbound guard. Its loops end with life.
type connGuard struct {
	h      host.Host
	limits LimitsConfig
	m      *status.Metrics
	life   context.Context
	// inbound is the resource manager's inbound connection limit of a
	// host the node built (0 with WithHost: no guard); kick wakes the
	// guard when a connection comes in.
	inbound int
	kick    chan struct{}
}

// start starts the trimming loop (when the limits ask for it) and the
// inbound guard (for a built host); both end with the node's life.
func (g *connGuard) start() {
	if g.limits.BoundConns && g.limits.ConnHigh > 0 {
		go every(g.life, netsetup.TrimEvery, func() { g.trimConns(time.Now()) })
	}
	if g.inbound > 0 {
		go func() {
			for {
				select {
				case <-g.life.Done():
					return
				case <-g.kick:
				}
				g.trimInbound(time.Now(), g.inbound)
				vclock.Sleep(g.life, netsetup.GuardPause)
			}
		}()
	}
}

// inboundOpened wakes the inbound guard (without waiting) after an
// inbound connection opened.
func (g *connGuard) inboundOpened() {
	if g.inbound <= 0 {
		return
	}
	select {
	case g.kick <- struct{}{}:
	default:
	}
}

// trimConns trims the host to ConnLow if it holds more than ConnHigh, and
// counts what it closed.
func (g *connGuard) trimConns(now time.Time) int {
	k := netsetup.TrimConns(g.h, now, g.limits.ConnLow, g.limits.ConnHigh)
	g.m.ConnsTrimmed.Add(float64(k))
	g.m.Hostile.WithLabelValues(status.KindIdleInboundClosed).Add(float64(k))
	return k
}

// trimInbound runs the inbound guard once, and counts what it closed.
func (g *connGuard) trimInbound(now time.Time, limit int) int {
	k := netsetup.TrimInbound(g.h, now, limit)
	g.m.ConnsTrimmed.Add(float64(k))
	return k
}

// every calls fn every period until life ends: the loop of a node's
// periodic background chores, run on a goroutine of its own.
func every(life context.Context, period time.Duration, fn func()) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-life.Done():
			return
		case <-t.C:
			fn()
		}
	}
}
