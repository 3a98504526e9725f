package report

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/pspnode/pspnode/internal/figure"
)

// WriteOut writes the run's CSV files, figures and summary.json under dir:
//
//	steps_over_time.csv   time_s,node,step
//	final_steps.csv       node,straggle_factor,final_step,live
//	barrier_waits.csv     wait_ms (recent waits of live nodes)
//	estimate.csv          time_s,true_n,median_rel_error,p5,p95
//	accuracy.csv          time_s,accuracy,loss,updates_sent,in_bytes_per_node
//	churn_events.csv      time_s,event,node (leave, crash, join: as each began)
//	processes.csv         one row per node process (netns transport only)
//	step_distribution.png, estimate.png, accuracy.png, summary.json
func (r *Result) WriteOut(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("output directory: %w", err)
	}
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', 6, 64) }
	var rows [][]string
	for _, s := range r.Rows.Steps {
		rows = append(rows, []string{f(s.T), strconv.Itoa(s.Node), strconv.FormatInt(s.Step, 10)})
	}
	if err := figure.CSV(filepath.Join(dir, "steps_over_time.csv"), []string{"time_s", "node", "step"}, rows); err != nil {
		return err
	}
	rows = nil
	var finals []float64
	for _, x := range r.Rows.Finals {
		rows = append(rows, []string{strconv.Itoa(x.Node), f(x.Factor), strconv.FormatInt(x.Step, 10), strconv.FormatBool(x.Live)})
		if x.Live {
			finals = append(finals, float64(x.Step))
		}
	}
	if err := figure.CSV(filepath.Join(dir, "final_steps.csv"), []string{"node", "straggle_factor", "final_step", "live"}, rows); err != nil {
		return err
	}
	rows = nil
	var ex, ey, elo, ehi []float64
	for _, e := range r.Rows.Estimates {
		rows = append(rows, []string{f(e.T), strconv.Itoa(e.Truth), f(e.Median), f(e.Lo), f(e.Hi)})
		ex, ey, elo, ehi = append(ex, e.T), append(ey, 100*e.Median), append(elo, 100*e.Lo), append(ehi, 100*e.Hi)
	}
	if err := figure.CSV(filepath.Join(dir, "estimate.csv"), []string{"time_s", "true_n", "median_rel_error", "p5_rel_error", "p95_rel_error"}, rows); err != nil {
		return err
	}
	rows = nil
	var ax, ay []float64
	for _, a := range r.Rows.Accuracy {
		rows = append(rows, []string{f(a.T), f(a.Accuracy), f(a.Loss), f(a.Updates), f(a.InBytes)})
		ax, ay = append(ax, a.T), append(ay, a.Accuracy)
	}
	if err := figure.CSV(filepath.Join(dir, "accuracy.csv"), []string{"time_s", "accuracy", "loss", "updates_sent", "in_bytes_per_node"}, rows); err != nil {
		return err
	}
	rows = nil
	for _, c := range r.Rows.Churn {
		rows = append(rows, []string{f(c.T), c.Kind, strconv.Itoa(c.Node)})
	}
	if err := figure.CSV(filepath.Join(dir, "churn_events.csv"), []string{"time_s", "event", "node"}, rows); err != nil {
		return err
	}
	if r.NetNS != nil {
		if err := r.NetNS.writeCSV(dir); err != nil {
			return err
		}
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "summary.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	title := fmt.Sprintf("%s: final steps of %d live nodes (%.0f s)", r.Barrier, r.LiveNodes, r.DurationS)
	if err := figure.Lines(filepath.Join(dir, "step_distribution.png"), figure.Options{Title: title, XLabel: "final step", YLabel: "share of nodes"}, figure.Distribution(r.Barrier, finals)); err != nil {
		return err
	}
	if len(ex) > 0 {
		if err := figure.Lines(filepath.Join(dir, "estimate.png"), figure.Options{Title: "Population estimate error (live nodes)", XLabel: "time (s)", YLabel: "|N̂ − N| / N (%)"},
			figure.Series{Name: "median", X: ex, Y: ey}, figure.Series{Name: "p5", X: ex, Y: elo}, figure.Series{Name: "p95", X: ex, Y: ehi}); err != nil {
			return err
		}
	}
	if len(ax) > 0 {
		if err := figure.Lines(filepath.Join(dir, "accuracy.png"), figure.Options{Title: fmt.Sprintf("%s: held-out accuracy", r.Barrier), XLabel: "time (s)", YLabel: "accuracy"}, figure.Series{Name: r.Barrier, X: ax, Y: ay}); err != nil {
			return err
		}
	}
	return nil
}

// WriteComparison writes figures that set several runs side by side under
// dir: step_distribution.png (final steps of every run), accuracy_time.png,
// accuracy_updates.png and accuracy_bytes.png (held-out accuracy against
// wall time, the number of updates sent, and the bytes a node received),
// and comparison.csv (one row per run).
func WriteComparison(dir string, results []*Result) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("output directory: %w", err)
	}
	var dists, accT, accU, accB []figure.Series
	var rows [][]string
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', 6, 64) }
	metric := "accuracy"
	for _, r := range results {
		var finals []float64
		for _, x := range r.Rows.Finals {
			if x.Live {
				finals = append(finals, float64(x.Step))
			}
		}
		dists = append(dists, figure.Distribution(r.Barrier, finals))
		st, su, sb := figure.Series{Name: r.Barrier}, figure.Series{Name: r.Barrier}, figure.Series{Name: r.Barrier}
		for _, a := range r.Rows.Accuracy {
			st.X, st.Y = append(st.X, a.T), append(st.Y, a.Accuracy)
			su.X, su.Y = append(su.X, a.Updates), append(su.Y, a.Accuracy)
			sb.X, sb.Y = append(sb.X, a.InBytes/1e6), append(sb.Y, a.Accuracy)
		}
		accT, accU, accB = append(accT, st), append(accU, su), append(accB, sb)
		final, tt := "", ""
		if a := r.Accuracy; a != nil {
			metric = a.Metric
			final = f(a.Final)
			if a.TimeToTarget != nil {
				tt = f(*a.TimeToTarget)
			}
		}
		rows = append(rows, []string{r.Barrier, strconv.Itoa(r.LiveNodes), f(r.Steps.Min), f(r.Steps.Mean), f(r.Steps.Max),
			f(r.Steps.P5), f(r.Steps.P95), strconv.Itoa(r.StalledNodes), final, tt, f(r.BarrierWaitMs.P50), f(r.DurationS)})
	}
	if err := figure.CSV(filepath.Join(dir, "comparison.csv"), []string{"barrier", "live_nodes", "steps_min", "steps_mean", "steps_max",
		"steps_p5", "steps_p95", "stalled_nodes", metric + "_final", "time_to_target_s", "barrier_wait_p50_ms", "duration_s"}, rows); err != nil {
		return err
	}
	r0 := results[0]
	if err := figure.Lines(filepath.Join(dir, "step_distribution.png"), figure.Options{
		Title: fmt.Sprintf("Final steps, %d nodes, %.0f s", r0.Nodes, r0.DurationS), XLabel: "final step", YLabel: "share of nodes",
	}, dists...); err != nil {
		return err
	}
	if r0.Model == "none" {
		return nil
	}
	if err := figure.Lines(filepath.Join(dir, "accuracy_time.png"), figure.Options{
		Title: fmt.Sprintf("Held-out %s against wall time (%d nodes, %s)", metric, r0.Nodes, r0.Model), XLabel: "time (s)", YLabel: metric, LegendBottom: true,
	}, accT...); err != nil {
		return err
	}
	if err := figure.Lines(filepath.Join(dir, "accuracy_bytes.png"), figure.Options{
		Title: fmt.Sprintf("Held-out %s against bytes received (%d nodes, %s)", metric, r0.Nodes, r0.Model), XLabel: "MB received per node", YLabel: metric, LegendBottom: true,
	}, accB...); err != nil {
		return err
	}
	return figure.Lines(filepath.Join(dir, "accuracy_updates.png"), figure.Options{
		Title: fmt.Sprintf("Held-out %s against updates sent (%d nodes, %s)", metric, r0.Nodes, r0.Model), XLabel: "updates sent (all nodes)", YLabel: metric, LegendBottom: true,
	}, accU...)
}
