package testnet

import (
	"context"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/pspnode/pspnode/testnet/report"
	"github.com/pspnode/pspnode/testnet/sim"
)

// overload measures a real-clock run's overload figures and judges them.
func (t *testnet) overload(p *lagProbe, elapsed, cpu time.Duration, r *report.Result) *report.Overload {
	lags := p.sorted()
	o := &report.Overload{
		TimerLagP50Ms: 1000 * sim.Percentile(lags, 50),
		TimerLagP95Ms: 1000 * sim.Percentile(lags, 95),
		TimerLagP99Ms: 1000 * sim.Percentile(lags, 99),
		StepTimeS:     2 * t.cfg.TimeScale,
	}
	if elapsed > 0 {
		o.CPUShare = cpu.Seconds() / (elapsed.Seconds() * float64(runtime.GOMAXPROCS(0)))
	}
	t.mu.Lock()
	if len(t.lags) > 0 {
		o.ChurnLagS = max(0, slices.Max(t.lags))
	}
	if o.StepTimeS == 0 { // real compute only: the nodes' own pace
		var iv []float64
		for _, m := range t.liveLocked() {
			if s := m.nd.Status().StepIntervalS; s > 0 {
				iv = append(iv, s)
			}
		}
		slices.Sort(iv)
		o.StepTimeS = sim.Percentile(iv, 50)
	}
	t.mu.Unlock()
	o.Judge()
	return o
}

// lagProbe measures how late goroutines of this process run: every
// probePeriod it sets a timer and, once woken, yields the processor
// (runtime.Gosched), and records how much later than the timer's due time
// it ran again.
//
// The yield is what makes it see an overloaded process. Go's scheduler
// runs a goroutine woken by a timer (or a channel) next on the processor
// that woke it, ahead of every other runnable goroutine, so a probe that
// only timed its timer read about 0 ms while hundreds of nodes' goroutines
// each waited seconds for a processor: a 200-node run at 1 % of the
// protocol's pace reported p99 0 ms. A goroutine that yields joins the
// global run queue behind all of them, as a node's goroutines do when a
// stream, a lock or a preemption makes them wait, so its wait is the
// process's. And every period counts: a probe that ran a second late
// records, as well, the lags a probe running every period would have seen
// meanwhile (lag − period, lag − 2 × period, ...), or one late second
// would weigh one sample against a hundred quick ones.
type lagProbe struct {
	mu     sync.Mutex
	lags   []float64 // seconds
	stride int       // record every stride-th measurement
	n      int
}

const (
	probePeriod = 10 * time.Millisecond
	maxProbes   = 1 << 16 // beyond, every other sample is dropped and the stride doubles
)

// run probes from start, the training's start, until ctx ends, and calls
// started once its timer is set. The first period is due probePeriod after
// start whenever the goroutine first runs: on an overloaded machine a
// goroutine just started can wait seconds for its first instruction (one
// run's probe, started after the nodes, took none in 44 s), and that wait
// is the process's too.
func (p *lagProbe) run(ctx context.Context, start time.Time, started func()) {
	due := start.Add(probePeriod)
	tm := time.NewTimer(time.Until(due))
	defer tm.Stop()
	started()
	for {
		select {
		case <-ctx.Done():
			if late := time.Since(due); late > 0 {
				p.noteLate(late) // the run ended while the probe waited
			}
			return
		case <-tm.C:
		}
		runtime.Gosched()
		p.noteLate(time.Since(due))
		due = time.Now().Add(probePeriod)
		tm.Reset(probePeriod)
	}
}

// noteLate records a probe that ran late by lag, and the periods it missed
// meanwhile (see lagProbe).
func (p *lagProbe) noteLate(lag time.Duration) {
	p.note(max(0, lag).Seconds())
	for l := lag - probePeriod; l > 0; l -= probePeriod {
		p.note(l.Seconds())
	}
}

func (p *lagProbe) note(lag float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n++
	if p.stride == 0 {
		p.stride = 1
	}
	if p.n%p.stride != 0 {
		return
	}
	if len(p.lags) == maxProbes { // keep samples spread over the whole run
		for i := range len(p.lags) / 2 {
			p.lags[i] = p.lags[2*i+1]
		}
		p.lags = p.lags[:len(p.lags)/2]
		p.stride *= 2
	}
	p.lags = append(p.lags, lag)
}

// count is how many samples the probe holds.
func (p *lagProbe) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.lags)
}

func (p *lagProbe) sorted() []float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := slices.Clone(p.lags)
	slices.Sort(s)
	return s
}
