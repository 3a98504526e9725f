package sim

import (
	"math"
	"slices"
	"sort"

	"github.com/pspnode/pspnode/psp"
)

// Stats summarises a distribution.
type Stats struct {
	Min    float64 `json:"min"`
	Mean   float64 `json:"mean"`
	Max    float64 `json:"max"`
	P5     float64 `json:"p5"`
	P50    float64 `json:"p50"`
	P95    float64 `json:"p95"`
	StdDev float64 `json:"stddev"`
}

// Summarize computes Stats over xs (nearest-rank percentiles). Empty input
// gives all zeros.
func Summarize(xs []float64) Stats {
	if len(xs) == 0 {
		return Stats{}
	}
	s := slices.Clone(xs)
	sort.Float64s(s)
	var sum, sq float64
	for _, x := range s {
		sum += x
	}
	mean := sum / float64(len(s))
	for _, x := range s {
		sq += (x - mean) * (x - mean)
	}
	return Stats{
		Min: s[0], Max: s[len(s)-1], Mean: mean,
		P5: Percentile(s, 5), P50: Percentile(s, 50), P95: Percentile(s, 95),
		StdDev: math.Sqrt(sq / float64(len(s))),
	}
}

// Percentile returns the nearest-rank p-th percentile of sorted xs.
func Percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// Lag is the recorded update sequence lag and the bound beside it.
type Lag struct {
	Updates  int     `json:"updates"`  // T: updates in the sequence
	Mean     float64 `json:"mean"`     // (1/T) Σ γ_t, in steps
	MeanSq   float64 `json:"mean_sq"`  // (1/T) Σ γ_t², in steps²
	R        int     `json:"r"`        // r of F(r)
	F        float64 `json:"F_r"`      // empirical F(r)
	BoundOK  bool    `json:"bound_ok"` // whether the bound applies (probabilistic, 0 < F < 1)
	BoundMu  float64 `json:"bound_mean,omitempty"`
	BoundVar float64 `json:"bound_var,omitempty"`
}

// Result is what one run recorded.
type Result struct {
	Barrier   string  `json:"barrier"`
	Nodes     int     `json:"nodes"`
	DurationS float64 `json:"duration_s"`
	Seed      uint64  `json:"seed"`
	Mode      string  `json:"mode"`

	Steps        Stats   `json:"steps"`         // final steps of live nodes
	Live         int     `json:"live_nodes"`    // live nodes at the end
	Joined       int     `json:"joined"`        // nodes that joined by churn
	Left         int     `json:"left"`          // graceful leaves
	Crashed      int     `json:"crashed"`       // crashes
	StalledNodes int     `json:"stalled_nodes"` // live nodes waiting without progress for StallWindow
	WaitFraction float64 `json:"wait_fraction"` // share of live node-time spent waiting at barriers
	WaitS        Stats   `json:"wait_s"`        // lengths of individual barrier waits, seconds
	Checks       int     `json:"barrier_checks"`
	// ExcusedSlow and ExcusedFar count the peers behind a check's
	// threshold that the pace rule did not wait for (psp.CheckStats).
	ExcusedSlow int `json:"excused_slow"`
	ExcusedFar  int `json:"excused_far"`
	Lag         Lag `json:"lag"`
	// Stragglers is set when the run had stragglers.
	Stragglers *StragglerStats `json:"stragglers,omitempty"`

	// FinalSteps holds each node's final step in node order; nodes no longer
	// live are -1. Node i's straggle factor is Factors[i].
	FinalSteps []psp.Step `json:"-"`
	Factors    []float64  `json:"-"`
	// Times and Series: Series[k][i] is node i's step at Times[k]; -1 before
	// it joined and after it left.
	Times  []float64    `json:"-"`
	Series [][]psp.Step `json:"-"`
}

// StragglerStats is what a run with stragglers measured of each class
// apart: the final steps of the live fast nodes and stragglers, and the
// staleness of the steps each completed. A step's staleness is how far
// the job is ahead of it when it completes: the median step of 16 random
// live nodes less the step (0 if none is ahead), the lag a peer that
// merged the step's update would count.
type StragglerStats struct {
	FastSteps          Stats `json:"fast_steps"`
	StragglerSteps     Stats `json:"straggler_steps"`
	FastStaleness      Stats `json:"fast_staleness"`
	StragglerStaleness Stats `json:"straggler_staleness"`
}
