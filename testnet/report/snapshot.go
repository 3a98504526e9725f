package report

import (
	"slices"
	"time"

	"github.com/pspnode/pspnode/testnet/sim"
)

// Snapshot is the testnet's state at one moment, for live progress.
type Snapshot struct {
	Elapsed time.Duration // training time on the run's clock
	// Wall is the wall time since training started, or -1 when the run
	// cannot tell (the virtual clock without Config.WallClock).
	Wall          time.Duration
	Live          int
	StepMin       int64
	StepMedian    int64
	StepMax       int64
	EstimateError float64 // median |N̂ - N| / N over live nodes, NaN if none
	UpdatesPerSec float64
	Waiting       int
	Accuracy      float64 // last evaluation (accuracy, or R² for linreg), NaN if none
}

// Summarise fills a snapshot's step range and median estimate error from
// the live nodes' steps and relative errors (sorting steps), and returns
// the estimate row at time sec (ok false without errors).
func Summarise(snap *Snapshot, steps []int64, rel []float64, sec float64, truth int) (EstRow, bool) {
	if len(steps) > 0 {
		slices.Sort(steps)
		snap.StepMin, snap.StepMedian, snap.StepMax = steps[0], steps[(len(steps)-1)/2], steps[len(steps)-1]
	}
	if len(rel) == 0 {
		return EstRow{}, false
	}
	sorted := slices.Clone(rel)
	slices.Sort(sorted)
	snap.EstimateError = sorted[(len(sorted)-1)/2]
	return EstRow{T: sec, Truth: truth, Median: sim.Percentile(sorted, 50), Lo: sim.Percentile(sorted, 5), Hi: sim.Percentile(sorted, 95)}, true
}
