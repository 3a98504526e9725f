package report

import "fmt"

// Overload says whether the machine, not the protocol, set a real-clock
// run's pace. A testnet of N nodes in one process needs N nodes' worth of
// CPU at the moments they all compute, check and gossip; when that is more
// than the cores, every timer of every node fires late, steps stretch,
// churn falls behind its schedule, and the figures describe the machine.
//
// The rule: the run is flagged when a probe goroutine ran late by more than
// OverloadLagShare of the mean step time for more than 5 % of the training
// (the 95th percentile of its lag over time, see lagProbe), or when a churn
// event started more than one mean step time after its time. The mean step
// time is the time model's mean task time (2 s × the time scale), or, with
// no time model, the nodes' median time per step. CPU share is reported
// beside it, not judged: a run can use every core and still run every
// goroutine on time.
//
// The 95th percentile, not the 99th: on a machine shared with other work
// the operating system holds a process's threads off for a few hundred
// milliseconds now and then, at times for 1 % of a minute, which costs
// steps of seconds nothing (a 20-node run of 2-s steps beside a load
// average of 8 made the simulator's number of steps with a p99 of 122 ms,
// docs/results.md). An overloaded process is late all the time, at every
// percentile.
type Overload struct {
	Flagged bool `json:"flagged"`
	// TimerLagP50Ms, TimerLagP95Ms and TimerLagP99Ms are how late the
	// probe ran after its timer was due, the wait for a processor after a
	// yield included, over every probe period of the run (lagProbe).
	TimerLagP50Ms float64 `json:"timer_lag_p50_ms"`
	TimerLagP95Ms float64 `json:"timer_lag_p95_ms"`
	TimerLagP99Ms float64 `json:"timer_lag_p99_ms"`
	// CPUShare is the process's CPU time over training time × cores.
	CPUShare float64 `json:"cpu_share"`
	// ChurnLagS is the latest a churn event (Poisson or scripted) started
	// after its time; 0 without churn.
	ChurnLagS float64 `json:"churn_lag_s"`
	// StepTimeS is the mean step time the rule measures lag against.
	StepTimeS float64 `json:"step_time_s"`
	// Reason says which part of the rule flagged the run.
	Reason string `json:"reason,omitempty"`
}

// OverloadLagShare is the share of the mean step time that goroutines may
// run late (at p95, over time) before a real-clock run is flagged: a node
// whose barrier re-checks, hedges and progress wakes all come this much
// late loses about this share of its pace.
const OverloadLagShare = 0.05

// Judge applies the rule to the measured figures.
func (o *Overload) Judge() {
	step := o.StepTimeS
	switch {
	case !(step > 0):
		o.Flagged, o.Reason = false, ""
	case o.TimerLagP95Ms/1000 > OverloadLagShare*step:
		o.Flagged = true
		o.Reason = fmt.Sprintf("goroutines ran %.0f ms late at p95, more than %.0f %% of the %.2f s mean step", o.TimerLagP95Ms, 100*OverloadLagShare, step)
	case o.ChurnLagS > step:
		o.Flagged = true
		o.Reason = fmt.Sprintf("a churn event started %.1f s late, more than the %.2f s mean step", o.ChurnLagS, step)
	default:
		o.Flagged, o.Reason = false, ""
	}
}
