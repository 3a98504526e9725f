package node

import (
	"math"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"

	"github.com/pspnode/pspnode/psp"
)

// refusedProtocols label psp_streams_refused_total: each has its own
// inbound stream caps.
var refusedProtocols = []string{"step", "model", "exchange"}

// metrics are the node's Prometheus metrics (names psp_*), registered on
// the node's own registry so many nodes can live in one process.
type metrics struct {
	step          prometheus.Gauge
	waiting       prometheus.Gauge
	isolated      prometheus.Gauge
	wait          prometheus.Histogram
	checks        prometheus.Counter
	check         prometheus.Histogram
	rtt           prometheus.Histogram
	timeouts      prometheus.Counter
	queryErrors   prometheus.Counter
	malformed     prometheus.Counter
	modelBad      prometheus.Counter
	modelNone     prometheus.Counter
	applied       prometheus.Counter
	applyRejected prometheus.Counter
	loss          prometheus.Gauge
	accuracy      prometheus.Gauge
	connsOpened   prometheus.Counter
	connsTrimmed  prometheus.Counter
	stepDials     prometheus.Counter
	screened      *prometheus.CounterVec
	normRefused   prometheus.Counter
	refused       *prometheus.CounterVec
	hedged        prometheus.Counter
	earlyFail     prometheus.Counter
	staleStreams  prometheus.Counter
	pushed        prometheus.Counter
	cached        prometheus.Counter
	knownBehind   prometheus.Counter
	staleness     prometheus.Histogram
	unwedged      prometheus.Counter

	mu     sync.Mutex
	waits  ring // recent barrier waits, seconds
	checkL ring // recent barrier decision latencies, seconds
	rtts   ring // recent step query round trips, seconds
	// rttSmooth is an exponentially weighted mean of the round trips.
	rttSmooth float64
}

// stalenessBuckets are psp_update_staleness_steps' upper bounds, in steps.
var stalenessBuckets = []float64{-2, -1, 0, 1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 50}

func newMetrics(reg prometheus.Registerer) *metrics {
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
	m := &metrics{
		step:          g("step", "Iterations this node has completed."),
		waiting:       g("waiting", "1 while the node waits at its barrier."),
		isolated:      g("isolated", "1 while the node is isolated: its last barrier check heard from no peer of the job, so it waits (node/isolation.go)."),
		wait:          prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "psp", Name: "barrier_wait_seconds", Help: "Time spent waiting at the barrier per step.", Buckets: buckets}),
		checks:        c("barrier_checks_total", "Barrier checks (each with a fresh sample)."),
		check:         prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "psp", Name: "barrier_check_seconds", Help: "Latency of one barrier decision: sample, parallel step queries, decide.", Buckets: buckets}),
		rtt:           prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "psp", Name: "sample_rtt_seconds", Help: "Round trip of one step query.", Buckets: buckets}),
		timeouts:      c("samples_timed_out_total", "Step queries that timed out or failed (the peer was replaced)."),
		queryErrors:   c("step_query_errors_total", "Step queries answered with a malformed reply."),
		malformed:     c("step_requests_malformed_total", "Malformed step requests received."),
		modelBad:      c("model_requests_malformed_total", "Malformed model requests received (not one framed version byte)."),
		modelNone:     c("model_requests_unserved_total", "Model requests reset because this node had no model to give (a driven node without a trainer, or a trainer that did not answer in time)."),
		applied:       c("updates_applied_total", "Received updates applied to the model."),
		applyRejected: c("updates_apply_rejected_total", "Received updates the model refused (wrong length, not finite)."),
		loss:          g("model_loss", "Held-out loss at the last evaluation."),
		accuracy:      g("model_accuracy", "Held-out accuracy at the last evaluation."),
		connsOpened:   c("connections_opened_total", "Connections opened, inbound and outbound (each costs an identify exchange: a high rate at rest means the connection manager trims connections that peers re-dial)."),
		connsTrimmed:  c("connections_trimmed_total", "Connections this node closed to hold at most its high watermark, ConnHigh (node/connbound.go)."),
		stepDials:     c("step_dials_total", "Step queries that had to dial: the peer asked held no connection to this node."),
		screened: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "psp", Name: "step_reports_screened_total",
			Help: "Step reports not counted at the barrier, by verdict: stuck (no progress for many intervals), regressed (lower than before), quarantined (regressed recently)."}, []string{"verdict"}),
		staleness: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "psp", Name: "update_staleness_steps",
			Help:    "For each update (gossip) or model (epidemic) this node applied: its own completed steps when it applied it minus the sender's steps when the sender made it (negative: the sender was ahead). A trainer-driven node applies at its trainer's pull.",
			Buckets: stalenessBuckets}),
		unwedged:    c("unwedged_total", "Times this node found itself far ahead of every peer it asked, check after check, and took the job's step and model again (it had taken a step no other peer has)."),
		normRefused: c("updates_norm_refused_total", "Received updates refused because their norm exceeded NormBound × the upper quartile of the norms of this node's own recent updates."),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "psp", Name: "streams_refused_total",
			Help: "Inbound streams reset, by protocol (step, model, exchange), because the peer or the node was at the protocol's concurrent-stream cap, or because the node was still joining past the query timeout or failed to start."}, []string{"protocol"}),
		hedged:       c("step_queries_hedged_total", "Step queries still unanswered at the hedge delay, for which a fresh draw was asked beside."),
		staleStreams: c("step_streams_stale_total", "Step queries retried on a fresh stream because the peer had closed the idle one they took."),
		earlyFail:    c("barrier_checks_early_fail_total", "Barrier checks (pBSP, pSSP, BSP, SSP) that ended at the first answer below the threshold, before the other peers asked answered."),
		pushed:       c("progress_notes_sent_total", "Step queries sent on advancing to peers this node's step was holding back, to wake their barrier."),
		cached:       c("step_reports_cached_total", "Peers a barrier check counted without asking, because they were already seen at or above its threshold."),
		knownBehind:  c("barrier_checks_known_behind_total", "Barrier checks (pBSP, pSSP, BSP, SSP) that failed without asking, on a peer whose last answer was below the threshold and who promised a progress notice on reaching it."),
		waits:        newRing(4096),
		checkL:       newRing(4096),
		rtts:         newRing(4096),
	}
	reg.MustRegister(m.step, m.waiting, m.isolated, m.wait, m.checks, m.check, m.rtt, m.timeouts,
		m.queryErrors, m.malformed, m.modelBad, m.modelNone, m.applied, m.applyRejected, m.loss, m.accuracy, m.connsOpened, m.connsTrimmed, m.stepDials,
		m.screened, m.normRefused, m.refused, m.hedged, m.earlyFail, m.staleStreams, m.pushed, m.cached, m.knownBehind, m.staleness, m.unwedged)
	for _, v := range []psp.Verdict{psp.Stuck, psp.Regressed, psp.Quarantined} {
		m.screened.WithLabelValues(v.String()) // export zeros
	}
	for _, p := range refusedProtocols {
		m.refused.WithLabelValues(p)
	}
	return m
}

// RegisterProcessMetrics adds the Go runtime and process collectors to a
// registry (for a process that runs one node).
func RegisterProcessMetrics(reg prometheus.Registerer) {
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
}

func (m *metrics) observeWait(s float64) {
	m.wait.Observe(s)
	m.mu.Lock()
	m.waits.add(s)
	m.mu.Unlock()
}

func (m *metrics) observeCheck(s float64) {
	m.check.Observe(s)
	m.mu.Lock()
	m.checkL.add(s)
	m.mu.Unlock()
}

func (m *metrics) observeRTT(s float64) {
	m.rtt.Observe(s)
	m.mu.Lock()
	m.rtts.add(s)
	if m.rttSmooth == 0 {
		m.rttSmooth = s
	} else {
		m.rttSmooth = 0.9*m.rttSmooth + 0.1*s
	}
	m.mu.Unlock()
}

// rttEWMA is the smoothed step-query round trip in seconds (0 before the
// first answer).
func (n *Node) rttEWMA() float64 {
	n.m.mu.Lock()
	defer n.m.mu.Unlock()
	return n.m.rttSmooth
}

// ring keeps the last n values. Its buffer grows as values come, so a
// node that records few (a short run, a testnet of thousands) holds few.
type ring struct {
	buf  []float64
	max  int
	next int // where the next value goes, once the buffer is full
}

func newRing(n int) ring { return ring{max: n} }

func (r *ring) add(v float64) {
	if len(r.buf) < r.max {
		r.buf = append(r.buf, v)
		return
	}
	r.buf[r.next] = v
	r.next = (r.next + 1) % r.max
}

// values returns the values kept, oldest first.
func (r *ring) values() []float64 {
	out := make([]float64, 0, len(r.buf))
	out = append(out, r.buf[r.next:]...)
	return append(out, r.buf[:r.next]...)
}

// Recent returns the node's recent barrier waits, barrier decision
// latencies and step-query round trips, in seconds (up to the last 4096 of
// each).
func (n *Node) Recent() (waits, checks, rtts []float64) {
	n.m.mu.Lock()
	defer n.m.mu.Unlock()
	return n.m.waits.values(), n.m.checkL.values(), n.m.rtts.values()
}

// counterValue reads a counter's current value.
func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return 0
	}
	return m.GetCounter().GetValue()
}

// histogramSum returns the sum and count of a histogram's observations.
func histogramSum(h prometheus.Histogram) (sum float64, count uint64) {
	var m dto.Metric
	if err := h.Write(&m); err != nil {
		return 0, 0
	}
	return m.GetHistogram().GetSampleSum(), m.GetHistogram().GetSampleCount()
}

// registerGaugeFuncs registers the gauges read off the overlay and the host
// when /metrics is scraped. Set on every step instead, listing the
// connected peers alone was 2 % of a 1000-node testnet's CPU.
func (n *Node) registerGaugeFuncs() {
	gf := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "psp", Name: name, Help: help}, f)
	}
	stderr := func() float64 {
		_, se, err := n.ov.Estimate()
		if err != nil {
			return math.NaN()
		}
		return se
	}
	n.reg.MustRegister(
		gf("population_estimate", "Estimated number of nodes in the job, itself included: the population its learning rate follows (1 for a node alone).", n.population),
		gf("population_estimate_stderr", "Standard error of the estimators' population estimate (NaN while they have too little data).", stderr),
		gf("routing_table_size", "Peers in the Kademlia routing table.", func() float64 { return float64(n.ov.DHT().RoutingTable().Size()) }),
		gf("connected_peers", "Peers with an open connection.", func() float64 { return float64(len(n.h.Network().Peers())) }),
	)
}
