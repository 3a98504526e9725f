package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	prommodel "github.com/prometheus/common/model"
)

// waitMetric is the daemons' histogram of the time a step waited at the
// barrier.
const waitMetric = "psp_barrier_wait_seconds"

// metricSum is the sum of a histogram or summary in a /metrics body, its
// series added; ok is false when the body has no such family.
func metricSum(body, name string) (sum float64, ok bool, err error) {
	if body == "" {
		return 0, false, nil
	}
	p := expfmt.NewTextParser(prommodel.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		return 0, false, fmt.Errorf("metrics: %w", err)
	}
	fam, ok := fams[name]
	if !ok {
		return 0, false, nil
	}
	for _, m := range fam.GetMetric() {
		switch fam.GetType() {
		case dto.MetricType_HISTOGRAM:
			sum += m.GetHistogram().GetSampleSum()
		case dto.MetricType_SUMMARY:
			sum += m.GetSummary().GetSampleSum()
		default:
			return 0, false, nil
		}
	}
	return sum, true, nil
}

// waitShares is, for a pspnode run, the median over its fast workers (and
// over its slow ones) of the share of a worker's training time its daemon
// spent waiting at the barrier, from the files kept beside the run's
// record (NaN where they are missing: DDP, or a run saved without them).
func (c *config) waitShares(r run) (fast, slow float64) {
	if r.System == "ddp" {
		return math.NaN(), math.NaN()
	}
	cl := cell{Tier: mustTier(r.Tier), Model: c.model(r.Model), Slow: r.Slow}
	base := strings.TrimSuffix(c.savedPath(cl, r.System, r.Seed), ".json")
	var fs, ss []float64
	for i := range c.workers {
		body, err := os.ReadFile(fmt.Sprintf("%s.d%d.metrics", base, i))
		if err != nil {
			continue
		}
		wait, ok, err := metricSum(string(body), waitMetric)
		if err != nil || !ok {
			continue
		}
		var s summary
		b, err := os.ReadFile(fmt.Sprintf("%s.w%d.json", base, i))
		if err != nil || json.Unmarshal(b, &s) != nil || s.Elapsed <= 0 {
			continue
		}
		if slices.Contains(r.slowSet(), i) {
			ss = append(ss, wait/s.Elapsed)
		} else {
			fs = append(fs, wait/s.Elapsed)
		}
	}
	return spreadOf(fs).Median, spreadOf(ss).Median
}
