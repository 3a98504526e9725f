package testnet

import (
	"context"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/pspnode/pspnode/internal/vclock"
	"github.com/pspnode/pspnode/testnet/plan"
	"github.com/pspnode/pspnode/testnet/sim"
)

// churn plays the configured churn until ctx ends: leaves and joins as two
// independent Poisson processes (each at Churn × Nodes per minute), or,
// with ChurnReplace, leaves each followed by a join once the leaver has
// gone; and the script's events at their times. Every event runs in a
// goroutine of its own, so a slow join or a graceful leave waiting for a
// step to end never delays the next event, on either clock. It returns
// when every event it started has finished.
func (t *testnet) churn(ctx context.Context) {
	var wg sync.WaitGroup
	if rate := t.cfg.Churn * float64(t.cfg.Nodes) / 60; rate > 0 {
		wg.Go(func() {
			t.poisson(ctx, rate, 0x1ea7e, func(rng *rand.Rand) func() {
				mode := t.cfg.ChurnMode
				crash := mode == sim.Crash || (mode == sim.Mixed && rng.IntN(2) == 0)
				return func() {
					if t.remove(1, crash) > 0 && t.cfg.ChurnReplace {
						t.join(ctx)
					}
				}
			})
		})
		if !t.cfg.ChurnReplace { // else each leave brings its join
			wg.Go(func() {
				t.poisson(ctx, rate, 0x701, func(*rand.Rand) func() {
					return func() { t.join(ctx) }
				})
			})
		}
	}
	for _, ev := range t.cfg.Script {
		wg.Go(func() {
			if t.sleepUntil(ctx, ev.At) {
				t.playEvent(ctx, ev)
			}
		})
	}
	wg.Wait()
}

// poisson runs a Poisson process of the given rate (events per second),
// its times drawn from its own stream of the seed. At each time it asks
// next for the event (drawing any of its random choices from the same
// stream, so the schedule depends on the seed alone) and runs it in a
// goroutine of its own.
func (t *testnet) poisson(ctx context.Context, rate float64, stream uint64, next func(*rand.Rand) func()) {
	rng := rand.New(rand.NewPCG(t.cfg.Seed, stream))
	var events sync.WaitGroup
	defer events.Wait()
	var at time.Duration
	for {
		at += time.Duration(rng.ExpFloat64() / rate * float64(time.Second))
		if !t.sleepUntil(ctx, at) {
			return
		}
		events.Go(next(rng))
	}
}

// sleepUntil waits until at (training time) and notes how late it woke
// (the churn schedule's lag); false if ctx ended first.
func (t *testnet) sleepUntil(ctx context.Context, at time.Duration) bool {
	vclock.Sleep(ctx, at-time.Since(t.start))
	if ctx.Err() != nil {
		return false
	}
	lag := time.Since(t.start) - at
	t.mu.Lock()
	t.lags = append(t.lags, lag.Seconds())
	t.mu.Unlock()
	return true
}

// playEvent applies one churn-script event.
func (t *testnet) playEvent(ctx context.Context, ev plan.Event) {
	n := ev.Count
	if ev.Fraction > 0 {
		t.mu.Lock()
		n = int(math.Round(ev.Fraction * float64(len(t.liveLocked()))))
		t.mu.Unlock()
	}
	t.log.Info("churn script", "event", ev.String(), "nodes", n)
	switch ev.Action {
	case plan.Join:
		var wg sync.WaitGroup
		for range n { // the joins of one event start together
			wg.Go(func() { t.join(ctx) })
		}
		wg.Wait()
	case plan.Leave:
		t.remove(n, false)
	case plan.Crash:
		t.remove(n, true)
	case plan.Partition:
		t.partition(n)
	case plan.Heal:
		if t.net != nil {
			t.net.Heal()
		}
	case plan.CrashHostile:
		t.removeHostile()
	}
}
