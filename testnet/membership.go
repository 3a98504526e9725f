package testnet

import (
	"context"
	"time"
)

// Membership is what the honest live nodes' overlays hold at the end of a
// run: means over those nodes, and the largest. Peers that name peers
// which do not exist (the fake-peers role) show here.
type Membership struct {
	// Members counts the known peers not known to be dead, Unconfirmed
	// those of them known only from other nodes (named in a lookup reply,
	// with no first-hand evidence of life yet), Dead the peers held dead,
	// and Drawable the peers Sample draws from (overlay.Status).
	Members        float64 `json:"members_mean"`
	MembersMax     int     `json:"members_max"`
	Unconfirmed    float64 `json:"unconfirmed_mean"`
	UnconfirmedMax int     `json:"unconfirmed_max"`
	Dead           float64 `json:"dead_mean"`
	Drawable       float64 `json:"drawable_mean"`
	// SampleUs is the wall time of one Sample(β) call, in microseconds:
	// the mean of sampleCalls calls on every honest live node, one node
	// after another, at the end of training. 0 when the run cannot read a
	// wall clock (the virtual clock without Config.WallClock).
	SampleUs float64 `json:"sample_us"`
}

// sampleCalls is how many Sample calls each honest node makes to time
// SampleUs.
const sampleCalls = 1000

// membership measures the honest live nodes' overlays; nodes must still
// run.
func (t *testnet) membership() *Membership {
	t.mu.Lock()
	var honest []*member
	for _, m := range t.liveLocked() {
		if m.role == Honest {
			honest = append(honest, m)
		}
	}
	t.mu.Unlock()
	f := &Membership{}
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
	if t.cfg.Clock == Real {
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
