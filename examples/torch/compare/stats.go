package main

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	prommodel "github.com/prometheus/common/model"

	"github.com/pspnode/pspnode/examples/torch/evals"
	"github.com/pspnode/pspnode/internal/promhist"
)

// stalenessMetric is the daemons' histogram of update staleness: for each
// update or model a daemon applies, its own step minus the sender's.
const stalenessMetric = "psp_update_staleness_steps"

// medianCurve is the median worker's accuracy (of those curves gives:
// worker 0 alone, or every worker) every half second from 0
// to dur (each worker at its latest evaluation; points before every worker
// has one are left out), and the first time it reaches target (NaN:
// never). With an even number of workers the median is the upper one: half
// the workers are at least this good.
func medianCurve(curves [][]evals.Eval, target, dur float64) ([][2]float64, float64) {
	var curve [][2]float64
	reached := math.NaN()
	if len(curves) == 0 {
		return nil, reached
	}
	for t := 0.0; t <= dur+1e-9; t += 0.5 {
		var accs []float64
		for _, ev := range curves {
			acc := math.NaN()
			for _, e := range ev {
				if e.Time <= t {
					acc = e.Accuracy
				}
			}
			if !math.IsNaN(acc) {
				accs = append(accs, acc)
			}
		}
		if len(accs) < len(curves) {
			continue
		}
		slices.Sort(accs)
		m := accs[len(accs)/2]
		curve = append(curve, [2]float64{t, m})
		if math.IsNaN(reached) && m >= target {
			reached = t
		}
	}
	return curve, reached
}

// hist is a Prometheus histogram: cumulative counts by upper bound, in
// increasing order (the last bound +Inf), and its sum.
type hist struct {
	le, cum    []float64
	sum, count float64
}

// stalenessOf reads the staleness histogram from a /metrics body: ok is
// false when the body has none (a daemon built before the metric). Series
// with labels are added together.
func stalenessOf(body string) (h hist, ok bool, err error) {
	if body == "" {
		return h, false, nil
	}
	p := expfmt.NewTextParser(prommodel.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		return h, false, fmt.Errorf("metrics: %w", err)
	}
	fam, ok := fams[stalenessMetric]
	if !ok || fam.GetType() != dto.MetricType_HISTOGRAM {
		return h, false, nil
	}
	for _, m := range fam.GetMetric() {
		hm := m.GetHistogram()
		bs := slices.Clone(hm.GetBucket())
		slices.SortFunc(bs, func(a, b *dto.Bucket) int { return cmp.Compare(a.GetUpperBound(), b.GetUpperBound()) })
		var one hist
		for _, b := range bs {
			one.le = append(one.le, b.GetUpperBound())
			one.cum = append(one.cum, float64(b.GetCumulativeCount()))
		}
		if len(one.le) == 0 || !math.IsInf(one.le[len(one.le)-1], 1) {
			one.le = append(one.le, math.Inf(1))
			one.cum = append(one.cum, float64(hm.GetSampleCount()))
		}
		one.sum, one.count = hm.GetSampleSum(), float64(hm.GetSampleCount())
		h = h.add(one)
	}
	return h, true, nil
}

// add is h and o together; o's bounds must be h's (one binary's daemons),
// else o is left out.
func (h hist) add(o hist) hist {
	if len(h.le) == 0 {
		return hist{le: slices.Clone(o.le), cum: slices.Clone(o.cum), sum: o.sum, count: o.count}
	}
	if !slices.Equal(h.le, o.le) {
		return h
	}
	for i := range h.cum {
		h.cum[i] += o.cum[i]
	}
	h.sum += o.sum
	h.count += o.count
	return h
}

// quantile is the q-quantile as Prometheus's histogram_quantile estimates
// it: linear within the bucket it falls in, the first bucket starting at
// 0 (or at its bound when that is not positive), the +Inf bucket
// answering the largest finite bound.
func (h hist) quantile(q float64) float64 {
	if h.count == 0 {
		return math.NaN()
	}
	return promhist.Quantile(h.le, h.cum, q)
}

// staleness is a run's update staleness over all its daemons.
type staleness struct {
	Updates float64  `json:"updates"`
	Mean    *float64 `json:"mean_steps,omitempty"` // nil without updates
	P90     *float64 `json:"p90_steps,omitempty"`
}

// summarise adds the daemons' histograms; nil when none had the metric.
func summarise(hs []hist) *staleness {
	if len(hs) == 0 {
		return nil
	}
	var all hist
	for _, h := range hs {
		all = all.add(h)
	}
	s := &staleness{Updates: all.count}
	if all.count > 0 {
		s.Mean, s.P90 = nanPtr(all.sum/all.count), nanPtr(all.quantile(0.9))
	}
	return s
}

func (s *staleness) String() string {
	if s == nil {
		return "n/a"
	}
	if s.Mean == nil {
		return "no updates"
	}
	p90 := "?"
	if s.P90 != nil {
		p90 = fmt.Sprintf("%.1f", *s.P90)
	}
	return fmt.Sprintf("mean %.2f, p90 %s steps", *s.Mean, p90)
}

// spread is a figure over a cell's seeds: the median and the range.
type spread struct {
	Median, Min, Max float64
	N                int // values that were numbers
	Of               int // values in all
}

// spreadOf is the spread of vs, NaNs left out (and counted in Of only).
func spreadOf(vs []float64) spread {
	s := spread{Median: math.NaN(), Min: math.NaN(), Max: math.NaN(), Of: len(vs)}
	var ok []float64
	for _, v := range vs {
		if !math.IsNaN(v) {
			ok = append(ok, v)
		}
	}
	s.N = len(ok)
	if len(ok) == 0 {
		return s
	}
	slices.Sort(ok)
	s.Min, s.Max = ok[0], ok[len(ok)-1]
	if len(ok)%2 == 1 {
		s.Median = ok[len(ok)/2]
	} else {
		s.Median = (ok[len(ok)/2-1] + ok[len(ok)/2]) / 2
	}
	return s
}

// timeSpread is the spread of times to the target, where a run that did
// not reach it counts as slower than any that did: the median is "not
// reached" when half the runs or more did not.
func timeSpread(ts []float64) spread {
	s := spread{Median: math.NaN(), Min: math.NaN(), Max: math.NaN(), Of: len(ts)}
	v := slices.Clone(ts)
	for i := range v {
		if math.IsNaN(v[i]) {
			v[i] = math.Inf(1)
		} else {
			s.N++
		}
	}
	if len(v) == 0 {
		return s
	}
	slices.Sort(v)
	var m float64
	if len(v)%2 == 1 {
		m = v[len(v)/2]
	} else {
		m = (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	nan := func(x float64) float64 {
		if math.IsInf(x, 1) {
			return math.NaN()
		}
		return x
	}
	s.Median, s.Min, s.Max = nan(m), nan(v[0]), nan(v[len(v)-1])
	return s
}

// format writes the spread as "median (min–max)" with f, or "—".
func (s spread) format(f func(float64) string) string {
	if s.Of == 0 {
		return "—"
	}
	if s.Of == 1 || (f(s.Min) == f(s.Max) && s.N == s.Of) {
		return f(s.Median)
	}
	return fmt.Sprintf("%s (%s–%s)", f(s.Median), f(s.Min), f(s.Max))
}
