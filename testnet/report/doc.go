// Package report is what a testnet run measured and how it is shown:
// Result (the JSON `pspnode testnet --json` prints) and every figure it
// carries, the live Snapshot, PrintSummary and PrintComparison (the
// printed tables), WriteOut and WriteComparison (CSV files, PNG figures,
// summary.json). Both runners, the in-process testnet and testnet/netns,
// fill a Result; the hostile roles fill its Hostility. The package only
// holds and presents figures: it runs nothing.
//
//	result.go    Result and the figures it carries: percentiles, accuracy, traffic, membership, comparison
//	rows.go      Rows: the time series behind the CSV files
//	snapshot.go  Snapshot, Summarise: live progress
//	hostile.go   Hostility's role figures (impostors, Sybils, hogs) and their printed lines
//	overload.go  Overload: whether the machine set a real-clock run's pace
//	cost.go      Cost: what a run cost, per node and per paper second
//	netns.go     NetnsReport: the netns transport's per-process figures
//	metrics.go   CounterOf: a counter of a node's metrics registry
//	print.go     the printed summary and comparison
//	write.go     CSV files, figures, summary.json
package report
