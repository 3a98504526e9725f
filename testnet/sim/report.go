package sim

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/pspnode/pspnode/internal/figure"
	"github.com/pspnode/pspnode/psp"
)

// WriteOut writes the results of one or more runs under dir:
//
//	final_steps.csv       barrier,node,straggle_factor,final_step (live nodes)
//	steps_over_time.csv   barrier,time_s,node,step (when the series was recorded)
//	summary.json          the results, as `pspnode sim --json` prints them
//	step_distribution.png final-step distribution of every run on one figure
//	beta_sweep.png        the same figure titled as a β sweep, when sweep is set
func WriteOut(dir string, results []*Result, sweep bool) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("output directory: %w", err)
	}
	var final, series [][]string
	var dists []figure.Series
	for _, r := range results {
		var vals []float64
		for i, s := range r.FinalSteps {
			if s < 0 {
				continue
			}
			vals = append(vals, float64(s))
			final = append(final, []string{r.Barrier, strconv.Itoa(i), ftoa(r.Factors[i]), strconv.FormatInt(s, 10)})
		}
		for k, t := range r.Times {
			for i, s := range r.Series[k] {
				if s >= 0 {
					series = append(series, []string{r.Barrier, ftoa(t), strconv.Itoa(i), strconv.FormatInt(s, 10)})
				}
			}
		}
		dists = append(dists, figure.Distribution(r.Barrier, vals))
	}
	if err := figure.CSV(filepath.Join(dir, "final_steps.csv"), []string{"barrier", "node", "straggle_factor", "final_step"}, final); err != nil {
		return err
	}
	if len(series) > 0 {
		if err := figure.CSV(filepath.Join(dir, "steps_over_time.csv"), []string{"barrier", "time_s", "node", "step"}, series); err != nil {
			return err
		}
	}
	b, err := json.MarshalIndent(results, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "summary.json"), append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("summary: %w", err)
	}
	title := fmt.Sprintf("Progress distribution in steps (%d nodes, %.0f s)", results[0].Nodes, results[0].DurationS)
	name := "step_distribution.png"
	if sweep {
		title = fmt.Sprintf("%s parameterised by sample size β (%d nodes, %.0f s)", results[0].Barrier, results[0].Nodes, results[0].DurationS)
		name = "beta_sweep.png"
	}
	return figure.Lines(filepath.Join(dir, name), figure.Options{Title: title, XLabel: "final step", YLabel: "share of nodes"}, dists...)
}

// WriteBound writes bound.csv and bound.png (the mean and variance bounds
// against F(r), one line per β, log scale) under dir.
func WriteBound(dir string, rows []BoundRow) error {
	var out [][]string
	byBeta := map[int]*[2]figure.Series{}
	var betas []int
	for _, r := range rows {
		out = append(out, []string{ftoa(r.F), strconv.Itoa(r.Beta), strconv.Itoa(r.R), strconv.Itoa(r.T), ftoa(r.A), ftoa(r.S), ftoa(r.Mean), ftoa(r.Variance)})
		s, ok := byBeta[r.Beta]
		if !ok {
			s = &[2]figure.Series{{Name: fmt.Sprintf("β=%d", r.Beta)}, {Name: fmt.Sprintf("β=%d", r.Beta)}}
			byBeta[r.Beta] = s
			betas = append(betas, r.Beta)
		}
		s[0].X, s[0].Y = append(s[0].X, r.F), append(s[0].Y, r.Mean)
		s[1].X, s[1].Y = append(s[1].X, r.F), append(s[1].Y, r.Variance)
	}
	if err := figure.CSV(filepath.Join(dir, "bound.csv"), []string{"F_r", "beta", "r", "T", "a", "S", "mean_bound", "variance_bound"}, out); err != nil {
		return err
	}
	var mean, vari []figure.Series
	for _, b := range betas {
		mean, vari = append(mean, byBeta[b][0]), append(vari, byBeta[b][1])
	}
	r, T := rows[0].R, rows[0].T
	if err := figure.Lines(filepath.Join(dir, "bound_mean.png"), figure.Options{
		Title: fmt.Sprintf("Bound on the mean lag (r=%d, T=%d)", r, T), XLabel: "F(r)", YLabel: "mean bound", LogY: true, LegendLeft: true,
	}, mean...); err != nil {
		return err
	}
	return figure.Lines(filepath.Join(dir, "bound_variance.png"), figure.Options{
		Title: fmt.Sprintf("Bound on the variance of the lag (r=%d, T=%d)", r, T), XLabel: "F(r)", YLabel: "variance bound", LogY: true, LegendLeft: true,
	}, vari...)
}

// BoundRow is one evaluation of psp.Bound.
type BoundRow struct {
	F        float64 `json:"F_r"`
	Beta     int     `json:"beta"`
	R        int     `json:"r"`
	T        int     `json:"T"`
	A        float64 `json:"a"`
	S        float64 `json:"S"`
	Mean     float64 `json:"mean_bound"`
	Variance float64 `json:"variance_bound"`
}

// BoundTable evaluates psp.Bound for every F in fs and β in betas.
func BoundTable(fs []float64, betas []int, r, T int) ([]BoundRow, error) {
	var rows []BoundRow
	for _, b := range betas {
		for _, f := range fs {
			res, err := psp.Bound(f, b, r, T)
			if err != nil {
				return nil, err
			}
			rows = append(rows, BoundRow{F: f, Beta: b, R: r, T: T, A: res.A, S: res.S, Mean: res.Mean, Variance: res.Variance})
		}
	}
	return rows, nil
}

func ftoa(f float64) string { return strconv.FormatFloat(f, 'g', 6, 64) }
