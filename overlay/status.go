package overlay

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Status is a snapshot of the overlay's health.
type Status struct {
	Ready            bool          // joined and the first refresh finished
	RoutingTableSize int           // peers in the Kademlia routing table
	Members          int           // known peers not known to be dead
	Unconfirmed      int           // of those, peers only named by others, never heard from first-hand (at most MaxUnconfirmed)
	Drawable         int           // peers Sample draws from now (sampler.go)
	Dead             int           // peers currently held as dead
	Pool             int           // verified peers kept connected in the sampler's pool
	InDegree         int           // peers whose pools hold this node (pool.go)
	MalformedPool    int           // malformed pool requests refused
	ZoneDepth        int           // depth c of the zone-density estimator
	Lookups          int           // random-walk lookups in the estimate window
	Reports          int           // fresh peer-reported estimates
	Walks            int           // random walks done since start
	Refreshes        int           // routing-table refreshes done since start
	LastRefresh      time.Time     // zero before the first refresh
	SinceRefresh     time.Duration // time since LastRefresh (since start if none)
}

// Status returns a snapshot of the overlay's state.
func (o *Overlay) Status() Status {
	rtSize := o.dht.RoutingTable().Size()
	o.mu.Lock()
	defer o.mu.Unlock()
	s := Status{
		Ready:            o.ready,
		RoutingTableSize: rtSize,
		Members:          len(o.live),
		Dead:             len(o.members) - len(o.live),
		ZoneDepth:        o.zoneDepth,
		Lookups:          len(o.lookups),
		Reports:          len(o.reports),
		Walks:            o.walks,
		Refreshes:        o.refreshes,
		InDegree:         o.inDegree,
		MalformedPool:    o.malformed,
		LastRefresh:      o.lastRefresh,
	}
	for _, m := range o.pool {
		if m.verified {
			s.Pool++
		}
	}
	now := time.Now()
	for _, m := range o.draw {
		if o.drawableLocked(m, now) {
			s.Drawable++
		}
	}
	for e := o.unconfirmed.Front(); e != nil; e = e.Next() {
		if !e.Value.(*member).dead {
			s.Unconfirmed++
		}
	}
	if o.lastRefresh.IsZero() {
		s.SinceRefresh = time.Since(o.startedAt)
	} else {
		s.SinceRefresh = time.Since(o.lastRefresh)
	}
	return s
}

// Health returns nil when the overlay is usable: joined, connected to the
// network (or alone by design) and refreshed recently. Otherwise it says
// what is wrong.
func (o *Overlay) Health() error {
	s := o.Status()
	o.mu.Lock()
	closed := o.closed
	o.mu.Unlock()
	switch {
	case closed:
		return ErrClosed
	case !s.Ready:
		return errors.New("overlay: not ready: join or first refresh still running")
	case s.RoutingTableSize == 0 && len(o.bootstrap) > 0:
		return errors.New("overlay: routing table empty")
	case s.RoutingTableSize > 0 && s.SinceRefresh > 3*o.cfg.RefreshInterval+o.cfg.QueryTimeout:
		return fmt.Errorf("overlay: no routing-table refresh for %v", s.SinceRefresh.Round(time.Second))
	}
	return nil
}

// WaitReady blocks until the overlay is ready (joined and first refresh
// done) or ctx ends.
func (o *Overlay) WaitReady(ctx context.Context) error {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		o.mu.Lock()
		ready, closed := o.ready, o.closed
		o.mu.Unlock()
		switch {
		case closed:
			return ErrClosed
		case ready:
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("overlay: waiting for ready: %w", ctx.Err())
		case <-t.C:
		}
	}
}
