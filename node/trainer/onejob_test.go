package trainer

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/pspnode/pspnode/node"
	"github.com/pspnode/pspnode/node/exchange"
	pb "github.com/pspnode/pspnode/node/trainer/trainerpb"
)

// stepper is a test trainer that trains a vector of its own: it publishes
// a constant step (a delta under gossip, the model under epidemic), adds
// what it pulls, and takes the job's state when the daemon says to.
type stepper struct {
	tr     *trainer
	mu     sync.Mutex
	step   int64
	params []float32
	resets int
}

func (s *stepper) snapshot() (int64, []float32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.step, append([]float32(nil), s.params...)
}

// run steps until ctx ends or a call fails.
func (s *stepper) run(ctx context.Context, t *testing.T) {
	model := s.tr.welcome.UpdateKind == pb.UpdateKind_UPDATE_KIND_MODEL
	delta := fill(s.tr.n, 1e-3)
	for ctx.Err() == nil {
		s.mu.Lock()
		next := s.step + 1
		for i := range s.params {
			s.params[i] += delta[i]
		}
		out := delta
		if model {
			out = append([]float32(nil), s.params...)
		}
		s.mu.Unlock()
		r, err := s.tr.stepShm(ctx, next, out)
		if err != nil {
			if ctx.Err() == nil {
				t.Errorf("step %d: %v", next, err)
			}
			return
		}
		s.mu.Lock()
		if rs := r.Pull.GetReset_(); rs != nil {
			s.step, s.params = rs.Step, s.tr.tensor(rs.Params)
			s.resets++
		} else {
			s.step = next
			if u := s.tr.pulled(r.Pull); model && u != nil {
				s.params = u // the model to take
			} else {
				for i, x := range u {
					s.params[i] += x
				}
			}
		}
		s.mu.Unlock()
	}
}

// Daemons started together, with trainers that connect together, form
// one job: however the launch goes (every trainer at the same instant, or
// one of them first), every daemon ends on one lineage, and a trainer
// whose daemon started a lineage of its own takes the job's step and
// parameters (a Reset) and trains on. Before, trainers that connected at
// once each started a lineage, and driven nodes never converged: the job
// stayed split for the whole run.
func TestOneLaunchOneJob(t *testing.T) {
	const workers, params = 4, 16
	for _, xspec := range []string{"epidemic:4", "gossip"} {
		for first := -1; first < workers; first++ {
			name := fmt.Sprintf("%s/together", xspec)
			if first >= 0 {
				name = fmt.Sprintf("%s/trainer-%d-first", xspec, first)
			}
			t.Run(name, func(t *testing.T) {
				ex, err := exchange.Parse(xspec)
				if err != nil {
					t.Fatal(err)
				}
				edit := func(c *node.Config, _ *Config) { c.Exchange.Spec = ex }
				ds := make([]*daemon, workers)
				ds[0] = startDaemon(t, "onejob", nil, "pssp:2:1", edit)
				var wg sync.WaitGroup
				for i := 1; i < workers; i++ {
					wg.Go(func() { ds[i] = startDaemon(t, "onejob", ds[0], "pssp:2:1", edit) })
				}
				wg.Wait()
				peersKnow(t, ds...)

				ss := make([]*stepper, workers)
				connectOne := func(i int) {
					s := &stepper{params: make([]float32, params)}
					tr, err := connectShm(t, ds[i].addr, hello("onejob", 7, params, 0), true)
					if err != nil {
						t.Errorf("trainer %d: %v", i, err)
						return
					}
					s.mu.Lock()
					s.tr, s.step = tr, tr.welcome.Step
					if tr.welcome.HasParams {
						s.params = f32s(tr.welcome.Params.GetData())
					}
					s.mu.Unlock()
					tr.mu.Lock()
					tr.params = s.snapshot
					tr.mu.Unlock()
					ss[i] = s
				}
				if first >= 0 {
					connectOne(first)
				}
				for i := range workers {
					if i != first {
						wg.Go(func() { connectOne(i) })
					}
				}
				wg.Wait()
				if t.Failed() {
					return
				}
				ctx, cancel := context.WithCancel(t.Context())
				for _, s := range ss {
					wg.Go(func() { s.run(ctx, t) })
				}
				waitFor(t, 60*time.Second, "one lineage and 40 steps on every daemon", func() bool {
					lineage := ds[0].node.Status().Lineage
					for _, d := range ds {
						st := d.node.Status()
						if st.Lineage == "" || st.Lineage != lineage || st.Step < 40 {
							return false
						}
					}
					return true
				})
				cancel()
				wg.Wait()
				resets := 0
				for _, s := range ss {
					resets += s.resets
				}
				t.Logf("one lineage; %d trainer(s) took the job's state", resets)
			})
		}
	}
}
