package testnet

import (
	"context"
	"time"

	"github.com/pspnode/pspnode/testnet/plan"
	"github.com/pspnode/pspnode/testnet/report"
)

// sampleCalls is how many Sample calls each honest node makes to time
// SampleUs.
const sampleCalls = 1000

// membership measures the honest live nodes' overlays; nodes must still
// run.
func (t *testnet) membership() *report.Membership {
	t.mu.Lock()
	var honest []*member
	for _, m := range t.liveLocked() {
		if m.role == plan.Honest {
			honest = append(honest, m)
		}
	}
	t.mu.Unlock()
	f := &report.Membership{}
	if len(honest) == 0 {
		return f
	}
	for _, m := range honest {
		ov := m.nd.Overlay()
		s := ov.Status()
		un := s.Members - ov.PeerCount()
		f.Members += float64(s.Members)
		f.MembersMax = max(f.MembersMax, s.Members)
		f.Unconfirmed += float64(un)
		f.UnconfirmedMax = max(f.UnconfirmedMax, un)
		f.Dead += float64(s.Dead)
		f.Drawable += float64(s.Drawable)
	}
	n := float64(len(honest))
	f.Members /= n
	f.Unconfirmed /= n
	f.Dead /= n
	f.Drawable /= n

	wall := t.wallNow
	if t.cfg.Clock == plan.Real {
		wall = func() time.Duration { return time.Duration(time.Now().UnixNano()) }
	}
	start := wall()
	if start < 0 {
		return f
	}
	beta := max(1, t.cfg.Barrier.Beta)
	ctx := context.Background()
	calls := 0
	for _, m := range honest {
		ov := m.nd.Overlay()
		for range sampleCalls {
			if _, err := ov.Sample(ctx, beta); err != nil {
				break
			}
			calls++
		}
	}
	if calls > 0 {
		f.SampleUs = float64(wall()-start) / float64(time.Microsecond) / float64(calls)
	}
	return f
}
