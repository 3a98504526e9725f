package report

import "time"

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
