package status

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"

	"github.com/pspnode/pspnode/internal/ring"
	"github.com/pspnode/pspnode/psp"
)

// RefusedProtocols label psp_streams_refused_total: each has its own
// inbound stream caps.
var RefusedProtocols = []string{"step", "model", "exchange"}

// HostileKinds label psp_hostile_messages_total.
const (
	KindPopulationOutlier = "population_outlier"
	KindStepStreamEvicted = "step_stream_evicted"
	KindIdleInboundClosed = "idle_inbound_closed"
	KindModelOutvoted     = "model_outvoted"
)

var HostileKinds = []string{KindPopulationOutlier, KindStepStreamEvicted, KindIdleInboundClosed, KindModelOutvoted}

// Reasons label psp_resets_total: the node converged on the job's
// lineage, or it was far ahead of every peer it asked.
const (
	ResetLineage = "lineage"
	ResetWedged  = "wedged"
)

var ResetReasons = []string{ResetLineage, ResetWedged}

// Metrics are a node's Prometheus metrics (names psp_*), registered on
// the node's own registry so many nodes can live in one process.
type Metrics struct {
	Step          prometheus.Gauge
	Waiting       prometheus.Gauge
	Isolated      prometheus.Gauge
	Wait          prometheus.Histogram
	Checks        prometheus.Counter
	Check         prometheus.Histogram
	RTT           prometheus.Histogram
	Timeouts      prometheus.Counter
	QueryErrors   prometheus.Counter
	Malformed     prometheus.Counter
	ModelBad      prometheus.Counter
	ModelNone     prometheus.Counter
	ModelBudget   prometheus.Counter
	DHTThrottled  prometheus.Counter
	Applied       prometheus.Counter
	ApplyRejected prometheus.Counter
	Loss          prometheus.Gauge
	Accuracy      prometheus.Gauge
	ConnsOpened   prometheus.Counter
	ConnsTrimmed  prometheus.Counter
	StepDials     prometheus.Counter
	Screened      *prometheus.CounterVec
	NormRefused   prometheus.Counter
	Refused       *prometheus.CounterVec
	Hedged        prometheus.Counter
	EarlyFail     prometheus.Counter
	StaleStreams  prometheus.Counter
	Pushed        prometheus.Counter
	Cached        prometheus.Counter
	KnownBehind   prometheus.Counter
	// Excused counts the peers behind a check's threshold that the pace
	// rule did not wait for, by reason (slow, far).
	Excused       *prometheus.CounterVec
	Staleness     prometheus.Histogram
	Unwedged      prometheus.Counter
	EventsDropped prometheus.Counter
	// Resets counts the times the node replaced its step and model (and a
	// driven node its trainer's) by the job's, by reason; ResetsRefused
	// the ones it refused for their rate.
	Resets        *prometheus.CounterVec
	ResetsRefused prometheus.Counter
	// hostile counts messages a defence judged hostile, by kind
	// (HostileKinds).
	Hostile *prometheus.CounterVec

	mu     sync.Mutex
	waits  ring.Ring // recent barrier waits, seconds
	checkL ring.Ring // recent barrier decision latencies, seconds
	rtts   ring.Ring // recent step query round trips, seconds
	// rttSmooth is an exponentially weighted mean of the round trips.
	rttSmooth float64
}

// stalenessBuckets are psp_update_staleness_steps' upper bounds, in steps.
var stalenessBuckets = []float64{-2, -1, 0, 1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 50}

// NewMetrics makes a node's metrics, registered with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	f := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: "psp", Name: name, Help: help}
	}
	g := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts(f(name, help)))
	}
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts(f(name, help)))
	}
	buckets := prometheus.ExponentialBuckets(0.0001, 2, 18) // 100 µs .. 13 s
	m := &Metrics{
		Step:          g("step", "Iterations this node has completed."),
		Waiting:       g("waiting", "1 while the node waits at its barrier."),
		Isolated:      g("isolated", "1 while the node is isolated: its last barrier check heard from no peer of the job, so it waits (node/isolation.go)."),
		Wait:          prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "psp", Name: "barrier_wait_seconds", Help: "Time spent waiting at the barrier per step.", Buckets: buckets}),
		Checks:        c("barrier_checks_total", "Barrier checks (each with a fresh sample)."),
		Check:         prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "psp", Name: "barrier_check_seconds", Help: "Latency of one barrier decision: sample, parallel step queries, decide.", Buckets: buckets}),
		RTT:           prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "psp", Name: "sample_rtt_seconds", Help: "Round trip of one step query.", Buckets: buckets}),
		Timeouts:      c("samples_timed_out_total", "Step queries that timed out or failed (the peer was replaced)."),
		QueryErrors:   c("step_query_errors_total", "Step queries answered with a malformed reply."),
		Malformed:     c("step_requests_malformed_total", "Malformed step requests received."),
		ModelBad:      c("model_requests_malformed_total", "Malformed model requests received (not one framed version byte)."),
		ModelNone:     c("model_requests_unserved_total", "Model requests reset because this node had no model to give (a driven node without a trainer, or a trainer that did not answer in time)."),
		DHTThrottled:  c("dht_answers_throttled_total", "DHT streams reset because answering would have waited too long for the peer's, or all peers', answer rate (32 KiB/s a peer, 512 KiB/s in all)."),
		ModelBudget:   c("model_requests_over_budget_total", "Model requests reset because the peer, or all peers together, had been sent their minute's budget of model bytes (4 models a peer, 16 in all)."),
		Applied:       c("updates_applied_total", "Received updates applied to the model."),
		ApplyRejected: c("updates_apply_rejected_total", "Received updates the model refused (wrong length, not finite)."),
		Loss:          g("model_loss", "Held-out loss at the last evaluation."),
		Accuracy:      g("model_accuracy", "Held-out accuracy at the last evaluation."),
		ConnsOpened:   c("connections_opened_total", "Connections opened, inbound and outbound (each costs an identify exchange: a high rate at rest means the connection manager trims connections that peers re-dial)."),
		ConnsTrimmed:  c("connections_trimmed_total", "Connections this node closed to hold at most its high watermark, ConnHigh (node/connbound.go)."),
		StepDials:     c("step_dials_total", "Step queries that had to dial: the peer asked held no connection to this node."),
		Screened: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "psp", Name: "step_reports_screened_total",
			Help: "Step reports not counted at the barrier, by verdict: stuck (no progress for many intervals), regressed (lower than before), quarantined (regressed recently)."}, []string{"verdict"}),
		Staleness: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "psp", Name: "update_staleness_steps",
			Help:    "For each update (gossip) or model (epidemic) this node applied: its own completed steps when it applied it minus the sender's steps when the sender made it (negative: the sender was ahead). A trainer-driven node applies at its trainer's pull.",
			Buckets: stalenessBuckets}),
		EventsDropped: c("events_dropped_total", "Events (node.WithEvents) dropped because the program's channel was full."),
		Unwedged:      c("unwedged_total", "Times this node found itself far ahead of every peer it asked, check after check, and took the job's step and model again (it had taken a step no other peer has)."),
		Resets: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "psp", Name: "resets_total",
			Help: "Times this node replaced its step and model (a driven node: its trainer's, with the next pull) by the job's, by reason: lineage (it converged on the job's lineage), wedged (it was far ahead of every peer it asked)."}, []string{"reason"}),
		ResetsRefused: c("resets_refused_total", "Resets this node refused because it had reset too often lately (at most 3, then one per 2 minutes): it stays on its lineage and step and looks again later."),
		NormRefused:   c("updates_norm_refused_total", "Received updates refused because their norm exceeded NormBound × the upper quartile of the norms of this node's own recent updates."),
		Refused: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "psp", Name: "streams_refused_total",
			Help: "Inbound streams reset, by protocol (step, model, exchange), because the peer or the node was at the protocol's concurrent-stream cap, or because the node was still joining past the query timeout or failed to start."}, []string{"protocol"}),
		Hedged:       c("step_queries_hedged_total", "Step queries still unanswered at the hedge delay, for which a fresh draw was asked beside."),
		StaleStreams: c("step_streams_stale_total", "Step queries retried on a fresh stream because the peer had closed the idle one they took."),
		EarlyFail:    c("barrier_checks_early_fail_total", "Barrier checks (pBSP, pSSP, BSP, SSP) that ended at the first answer below the threshold, before the other peers asked answered."),
		Pushed:       c("progress_notes_sent_total", "Step queries sent on advancing to peers this node's step was holding back, to wake their barrier."),
		Cached:       c("step_reports_cached_total", "Peers a barrier check counted without asking, because they were already seen at or above its threshold."),
		KnownBehind:  c("barrier_checks_known_behind_total", "Barrier checks (pBSP, pSSP, BSP, SSP) that failed without asking, on a peer whose last answer was below the threshold and who promised a progress notice on reaching it."),
		Excused: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "psp", Name: "barrier_peers_excused_total",
			Help: "Sampled peers behind a barrier check's threshold that the pace rule (pBSP, pSSP) did not wait for, by reason: slow (stepping more than the rule's factor times slower than this node) or far (further behind than the rule's horizon of this node's steps)."}, []string{"reason"}),
		Hostile: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "psp", Name: "hostile_messages_total",
			Help: "Messages a defence judged hostile, by kind: population_outlier (a peer's population report more than 4× from the node's population, or nonsense: it moves nothing), step_stream_evicted (an idle inbound step stream reset to make room for a new one), idle_inbound_closed (an idle unprotected inbound connection closed by the inbound guard, with three quarters of the inbound connection limit in use)."}, []string{"kind"}),
		waits:  ring.New(4096),
		checkL: ring.New(4096),
		rtts:   ring.New(4096),
	}
	reg.MustRegister(m.Step, m.Waiting, m.Isolated, m.Wait, m.Checks, m.Check, m.RTT, m.Timeouts,
		m.QueryErrors, m.Malformed, m.ModelBad, m.ModelNone, m.ModelBudget, m.DHTThrottled, m.Applied, m.ApplyRejected, m.Loss, m.Accuracy, m.ConnsOpened, m.ConnsTrimmed, m.StepDials,
		m.Screened, m.NormRefused, m.Refused, m.Hedged, m.EarlyFail, m.StaleStreams, m.Pushed, m.Cached, m.KnownBehind, m.Staleness, m.Unwedged, m.EventsDropped, m.Hostile, m.Excused,
		m.Resets, m.ResetsRefused)
	for _, k := range HostileKinds {
		m.Hostile.WithLabelValues(k)
	}
	for _, r := range []psp.Excuse{psp.Slow, psp.Far} {
		m.Excused.WithLabelValues(r.String()) // export zeros
	}
	for _, v := range []psp.Verdict{psp.Stuck, psp.Regressed, psp.Quarantined} {
		m.Screened.WithLabelValues(v.String()) // export zeros
	}
	for _, p := range RefusedProtocols {
		m.Refused.WithLabelValues(p)
	}
	for _, r := range ResetReasons {
		m.Resets.WithLabelValues(r)
	}
	return m
}

// RegisterProcessMetrics adds the Go runtime and process collectors to a
// registry (for a process that runs one node).
func RegisterProcessMetrics(reg prometheus.Registerer) {
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
}

// ObserveWait records a barrier wait, in seconds.
func (m *Metrics) ObserveWait(s float64) {
	m.Wait.Observe(s)
	m.mu.Lock()
	m.waits.Add(s)
	m.mu.Unlock()
}

// ObserveCheck records one barrier decision's latency, in seconds.
func (m *Metrics) ObserveCheck(s float64) {
	m.Check.Observe(s)
	m.mu.Lock()
	m.checkL.Add(s)
	m.mu.Unlock()
}

// ObserveRTT records a step query's round trip, in seconds.
func (m *Metrics) ObserveRTT(s float64) {
	m.RTT.Observe(s)
	m.mu.Lock()
	m.rtts.Add(s)
	if m.rttSmooth == 0 {
		m.rttSmooth = s
	} else {
		m.rttSmooth = 0.9*m.rttSmooth + 0.1*s
	}
	m.mu.Unlock()
}

// RTTEWMA is the smoothed step-query round trip in seconds (0 before the
// first answer).
func (m *Metrics) RTTEWMA() float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.rttSmooth
}

// Recent returns the recent barrier waits, barrier decision latencies and
// step-query round trips, in seconds (up to the last 4096 of each).
func (m *Metrics) Recent() (waits, checks, rtts []float64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.waits.Values(), m.checkL.Values(), m.rtts.Values()
}

// CounterValue reads a counter's current value.
func CounterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return 0
	}
	return m.GetCounter().GetValue()
}

// HistogramSum returns the sum and count of a histogram's observations.
func HistogramSum(h prometheus.Histogram) (sum float64, count uint64) {
	var m dto.Metric
	if err := h.Write(&m); err != nil {
		return 0, 0
	}
	return m.GetHistogram().GetSampleSum(), m.GetHistogram().GetSampleCount()
}
