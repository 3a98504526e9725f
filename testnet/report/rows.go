package report

// Rows are a run's time series: what WriteOut writes as CSV files and
// draws, beside the figures of the Result's JSON.
type Rows struct {
	Steps     []StepRow
	Estimates []EstRow
	Accuracy  []AccRow
	Churn     []ChurnRow
	Finals    []FinalRow
}

// StepRow is one live node's step at one record.
type StepRow struct {
	T    float64 // seconds of training
	Node int
	Step int64
}

// EstRow is the live nodes' population estimate error at one record:
// |N̂ - N| / N's median, 5th and 95th percentiles.
type EstRow struct {
	T              float64
	Truth          int
	Median, Lo, Hi float64
}

// ChurnRow is one churn event: at T, Node left, crashed or began to join.
type ChurnRow struct {
	T    float64
	Kind string // leave, crash or join
	Node int
}

// AccRow is one evaluation of the honest nodes' models.
type AccRow struct {
	T        float64
	Accuracy float64
	Loss     float64
	Updates  float64 // updates sent so far, by every node
	InBytes  float64 // mean bytes an honest live node received since its launch
}

// FinalRow is one node at the end of a run.
type FinalRow struct {
	Node   int
	Factor float64 // straggle factor
	Step   int64
	Live   bool
}
