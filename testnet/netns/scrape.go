package netns

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	prommodel "github.com/prometheus/common/model"

	"github.com/pspnode/pspnode/internal/builtin"
	"github.com/pspnode/pspnode/internal/promhist"
	"github.com/pspnode/pspnode/model"
	"github.com/pspnode/pspnode/node/status"
	"github.com/pspnode/pspnode/testnet/plan"
	"github.com/pspnode/pspnode/testnet/report"
)

// checkData opens the configured data set once, so a bad path is one
// error, not one per node.
func checkData(cfg plan.Config) error {
	if _, err := model.Open(builtin.DataFor(cfg.Model, cfg.Data)); err != nil {
		return fmt.Errorf("testnet: %w", err)
	}
	return nil
}

// metricSet is one node's /metrics: the value of every series without
// labels, by name (a histogram's sample count and sum as NAME_count and
// NAME_sum, as the text format writes them), and every histogram without
// labels. Series with labels are not kept: the report reads none.
type metricSet struct {
	values map[string]float64
	hists  map[string]histogram
}

// parseMetrics reads a Prometheus text format body. A body the format's
// parser rejects is an error naming the line, and no metrics.
func parseMetrics(rd io.Reader) (metricSet, error) {
	p := expfmt.NewTextParser(prommodel.UTF8Validation)
	fams, err := p.TextToMetricFamilies(rd)
	if err != nil {
		return metricSet{}, fmt.Errorf("metrics: %w", err)
	}
	m := metricSet{values: map[string]float64{}, hists: map[string]histogram{}}
	for name, fam := range fams {
		for _, s := range fam.GetMetric() {
			if len(s.GetLabel()) > 0 {
				continue
			}
			switch fam.GetType() {
			case dto.MetricType_COUNTER:
				m.values[name] = s.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				m.values[name] = s.GetGauge().GetValue()
			case dto.MetricType_UNTYPED:
				m.values[name] = s.GetUntyped().GetValue()
			case dto.MetricType_SUMMARY:
				m.values[name+"_count"] = float64(s.GetSummary().GetSampleCount())
				m.values[name+"_sum"] = s.GetSummary().GetSampleSum()
			case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
				h := s.GetHistogram()
				m.values[name+"_count"] = histCount(h.GetSampleCount(), h.GetSampleCountFloat())
				m.values[name+"_sum"] = h.GetSampleSum()
				m.hists[name] = newHistogram(h.GetBucket())
			}
		}
	}
	return m, nil
}

// histCount is a histogram count the parser kept as an integer or, when
// the text had a fraction, as a float.
func histCount(n uint64, f float64) float64 {
	if f != 0 {
		return f
	}
	return float64(n)
}

// histogram is a Prometheus histogram's cumulative bucket counts by upper
// bound, in increasing order (the last bound +Inf).
type histogram struct {
	le    []float64
	count []float64
}

// newHistogram sorts a parsed histogram's buckets by bound.
func newHistogram(buckets []*dto.Bucket) histogram {
	bs := slices.Clone(buckets)
	slices.SortFunc(bs, func(a, b *dto.Bucket) int { return cmp.Compare(a.GetUpperBound(), b.GetUpperBound()) })
	var h histogram
	for _, b := range bs {
		h.le = append(h.le, b.GetUpperBound())
		h.count = append(h.count, histCount(b.GetCumulativeCount(), b.GetCumulativeCountFloat()))
	}
	return h
}

// hist is histogram name, empty when m has none.
func (m metricSet) hist(name string) histogram { return m.hists[name] }

// add adds (sign 1) or subtracts (sign -1) o, which must have the same
// bounds (the nodes all run the same binary); an empty h takes o's bounds.
func (h *histogram) add(o histogram, sign float64) {
	if len(h.le) == 0 {
		h.le, h.count = slices.Clone(o.le), make([]float64, len(o.le))
	}
	if len(o.le) != len(h.le) {
		return
	}
	for i := range o.count {
		h.count[i] += sign * o.count[i]
	}
}

// quantile estimates the q-quantile as Prometheus's histogram_quantile
// does: linear within the bucket holding the rank, the first bucket from
// 0; a rank in the +Inf bucket gives the largest finite bound. NaN when
// empty. The buckets double, so the estimate is within a factor of 2.
func (h histogram) quantile(q float64) float64 {
	return promhist.Quantile(h.le, h.count, q)
}

// reading is one node's /status and /metrics at one moment; ok is false
// when the node did not answer.
type reading struct {
	st  status.Status
	met metricSet
	ok  bool
	at  time.Time
}

// read fetches p's /status, and its /metrics too with metrics.
func (r *netnsRun) read(ctx context.Context, p *proc, metrics bool) reading {
	rd := reading{at: time.Now()}
	get := func(path string, f func(io.Reader) error) bool {
		req, err := httpRequest(ctx, p.url+path)
		if err != nil {
			return false
		}
		resp, err := r.client.Do(req)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		return resp.StatusCode == 200 && f(resp.Body) == nil
	}
	rd.ok = get("/status", func(b io.Reader) error { return json.NewDecoder(b).Decode(&rd.st) })
	if rd.ok && metrics {
		rd.ok = get("/metrics", func(b io.Reader) error {
			var err error
			rd.met, err = parseMetrics(b)
			return err
		})
	}
	return rd
}

// readAll reads every node at once.
func (r *netnsRun) readAll(ctx context.Context, metrics bool) []reading {
	out := make([]reading, len(r.procs))
	var wg sync.WaitGroup
	for i, p := range r.procs {
		wg.Go(func() { out[i] = r.read(ctx, p, metrics) })
	}
	wg.Wait()
	return out
}

// loadAvg1 is this machine's one-minute load average (NaN where unknown).
func loadAvg1() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return math.NaN()
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return math.NaN()
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return math.NaN()
	}
	return v
}

// netnsTrack follows each node through training for the step, estimate,
// accuracy and stall records.
type netnsTrack struct {
	base      []int64 // each node's step when training started
	lastStep  []int64
	freeSince []time.Duration
	stalled   map[int]bool
	steps     []report.StepRow
	ests      []report.EstRow
	accs      []report.AccRow
	relErr    []float64
}

// record notes one round of readings taken at now into training.
func (k *netnsTrack) record(cfg plan.Config, now time.Duration, rs []reading) report.Snapshot {
	snap := report.Snapshot{Elapsed: now, Wall: now, EstimateError: math.NaN(), Accuracy: math.NaN()}
	var steps []int64
	var rel []float64
	var acc, loss float64
	var nacc int
	var sent float64
	truth := float64(len(rs))
	for i, rd := range rs {
		if !rd.ok {
			continue
		}
		snap.Live++
		s := rd.st.Step - k.base[i]
		if s != k.lastStep[i] {
			k.lastStep[i], k.freeSince[i] = s, -1
		}
		steps = append(steps, s)
		k.steps = append(k.steps, report.StepRow{T: now.Seconds(), Node: i, Step: s})
		if rd.st.Waiting {
			snap.Waiting++
		}
		if rd.st.EstimateError == "" && rd.st.PopulationEstimate > 0 {
			rel = append(rel, math.Abs(rd.st.PopulationEstimate-truth)/truth)
		} else {
			rel = append(rel, 1)
		}
		if rd.st.Accuracy != nil {
			acc += *rd.st.Accuracy
			if rd.st.Loss != nil {
				loss += *rd.st.Loss
			}
			nacc++
		}
		sent += float64(rd.st.UpdatesSent)
	}
	// Stalled: waiting at the barrier for StallWindow although the barrier,
	// on the true steps of every node, would have let it go on.
	minStep := slices.Min(append(slices.Clone(steps), math.MaxInt64))
	st := cfg.Barrier.BaseStaleness()
	for i, rd := range rs {
		if !rd.ok {
			continue
		}
		free := rd.st.Waiting && (st < 0 || minStep >= k.lastStep[i]-int64(st))
		if !free {
			k.freeSince[i] = -1
			continue
		}
		if k.freeSince[i] < 0 {
			k.freeSince[i] = now
		}
		if now-k.freeSince[i] >= cfg.StallWindow {
			k.stalled[i] = true
		}
	}
	if row, ok := report.Summarise(&snap, steps, rel, now.Seconds(), len(rs)); ok {
		k.ests = append(k.ests, row)
	}
	k.relErr = rel
	if nacc > 0 {
		snap.Accuracy = acc / float64(nacc)
		k.accs = append(k.accs, report.AccRow{T: now.Seconds(), Accuracy: acc / float64(nacc), Loss: loss / float64(nacc), Updates: sent})
	}
	return snap
}

// train runs the training window: the nodes already train (each started
// once it knew most of its peers); the window counts steps from its start.
func (r *netnsRun) train(ctx context.Context, warm time.Duration) (*report.Result, error) {
	cfg := r.cfg
	load0 := loadAvg1()
	// Readings outlive runCtx: the last one is taken after it ends.
	bg := context.WithoutCancel(ctx)
	start := time.Now()
	base := r.readAll(bg, true)
	runCtx, stop := context.WithDeadline(ctx, start.Add(cfg.Duration))
	defer stop()
	k := &netnsTrack{base: make([]int64, len(base)), lastStep: make([]int64, len(base)), freeSince: make([]time.Duration, len(base)), stalled: map[int]bool{}}
	for i, rd := range base {
		k.base[i], k.freeSince[i] = rd.st.Step, -1
	}
	tick := time.NewTicker(cfg.RecordEvery)
	defer tick.Stop()
	var lastUpdates uint64
loop:
	for {
		select {
		case <-runCtx.Done():
			break loop
		case <-tick.C:
		}
		rs := r.readAll(runCtx, false)
		snap := k.record(cfg, time.Since(start), rs)
		var u uint64
		for _, rd := range rs {
			u += rd.st.UpdatesReceived
		}
		if lastUpdates > 0 {
			snap.UpdatesPerSec = float64(u-min(u, lastUpdates)) / cfg.RecordEvery.Seconds()
		}
		lastUpdates = u
		if cfg.Progress != nil {
			cfg.Progress(snap)
		}
		if err := r.exitedEarly(); err != nil {
			return nil, err
		}
	}
	final := r.readAll(bg, true)
	elapsed := time.Since(start)
	k.record(cfg, elapsed, final)
	return r.result(k, base, final, elapsed, warm, load0), nil
}
