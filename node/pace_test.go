package node

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pspnode/pspnode/internal/memnet"
	"github.com/pspnode/pspnode/internal/vclock"
	"github.com/pspnode/pspnode/psp"
)

// pacedTask is a task without a model whose steps take what pace says
// for the time since t0 (a negative duration: the step never ends while
// the node runs).
type pacedTask struct {
	noWork
	t0   time.Time
	pace func(since time.Duration) time.Duration
}

func (p *pacedTask) Step(ctx context.Context) ([]float64, error) {
	d := p.pace(time.Since(p.t0))
	if d < 0 {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return nil, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// The pace rule on whole nodes, on the virtual clock: three nodes step
// every 100 ms under pssp:10:4 (every check asks every peer: SSP(4) in a
// job of four), and a fourth is slow, swings between paces, stops or
// goes. Within two seconds of any change the three step at their own
// pace again: at least 85 % of one step per 100 ms over the ten seconds
// measured. Before the rule a slow fourth node held them to its pace (24
// of the 100 steps with one ×4 slower, 10 with one ×10, 10 after one
// turned ×10 slower), and one that stopped but still answered held them
// for good (1 or 2 steps in ten seconds): the screen's stuck window is
// ten of the asker's step intervals, and every wait for the stopped peer
// lengthened the asker's interval.
func TestPaceOnNodes(t *testing.T) {
	every := func(d time.Duration) func(time.Duration) time.Duration {
		return func(time.Duration) time.Duration { return d }
	}
	fast := every(100 * time.Millisecond)
	after := func(at time.Duration, a, b time.Duration) func(time.Duration) time.Duration {
		return func(since time.Duration) time.Duration {
			if since < at {
				return a
			}
			return b
		}
	}
	tests := []struct {
		name     string
		fourth   func(time.Duration) time.Duration
		closeAt  time.Duration // the fourth node closes then (0: never)
		from, to time.Duration // the window measured
		slower   float64       // > 0: the fast nodes' PeerPace of the fourth says it is about this many times slower
	}{
		{"one x4 slower", every(400 * time.Millisecond), 0, 5 * time.Second, 15 * time.Second, 4},
		{"one x10 slower", every(time.Second), 0, 5 * time.Second, 15 * time.Second, 10},
		{"slow, then at their pace", after(10*time.Second, 400*time.Millisecond, 100*time.Millisecond), 0, 12 * time.Second, 22 * time.Second, 0},
		{"at their pace, then x10 slower", after(10*time.Second, 100*time.Millisecond, time.Second), 0, 12 * time.Second, 22 * time.Second, 0},
		{"stops, and still answers", after(5*time.Second, 100*time.Millisecond, -1), 0, 7 * time.Second, 17 * time.Second, 0},
		{"goes without a word", fast, 5 * time.Second, 7 * time.Second, 17 * time.Second, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			vclock.Test(t, func(t *testing.T) {
				mn := memnet.New(0)
				t.Cleanup(func() { _ = mn.Close() })
				t0 := time.Now()
				i := 0
				nodes := buildTestNodesWith(t, 4, "pssp:10:4", 0, memHosts(t, mn), func(s *nodeSetup) {
					pace := fast
					if i == 3 {
						pace = tt.fourth
					}
					i++
					s.Check.Pace = psp.DefaultPaceConfig()
					s.opts = append(s.opts, WithTask(&pacedTask{t0: t0, pace: pace}))
				})
				ctx, cancel := context.WithCancel(t.Context())
				wait := runAll(t, ctx, nodes[:3])
				defer wait()
				defer cancel()
				fourth := make(chan error, 1)
				go func() { fourth <- nodes[3].Run(ctx) }()
				if tt.closeAt > 0 {
					time.Sleep(tt.closeAt - time.Since(t0))
					_ = nodes[3].Close()
				}
				time.Sleep(tt.from - time.Since(t0))
				before := make([]int64, 3)
				for j, nd := range nodes[:3] {
					before[j] = nd.Step()
				}
				time.Sleep(tt.to - time.Since(t0))
				want := int64(0.85 * float64(tt.to-tt.from) / float64(100*time.Millisecond))
				for j, nd := range nodes[:3] {
					if got := nd.Step() - before[j]; got < want {
						t.Errorf("fast node %d made %d steps from %v to %v, want at least %d", j, got, tt.from, tt.to, want)
					}
				}
				if tt.slower > 0 {
					for j, nd := range nodes[:3] {
						pp, ok := nd.PeerPace(nodes[3].ID())
						if got := pp.Steps(); !ok || !pp.Slow || got < tt.slower/2 || got > 2*tt.slower {
							t.Errorf("fast node %d's PeerPace of the slow one: %+v (%v; %.2f of its steps), want slow, about %g", j, pp, ok, got, tt.slower)
						}
					}
				}
				cancel()
				wait()
				if err := <-fourth; err != nil && !(tt.closeAt > 0 && errors.Is(err, ErrClosed)) {
					t.Errorf("the fourth node: %v", err)
				}
			})
		})
	}
}
