package trainer

import "github.com/prometheus/client_golang/prometheus"

// metrics are the trainer API's, psp_trainer_*.
type metrics struct {
	connected      prometheus.Gauge
	sessions       prometheus.Counter
	refused        *prometheus.CounterVec
	calls          *prometheus.HistogramVec
	errors         *prometheus.CounterVec
	refusedUpdates prometheus.Counter
	merged         prometheus.Counter
	resets         prometheus.Counter
	paramsRequests *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	o := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: "psp", Subsystem: "trainer", Name: name, Help: help}
	}
	m := &metrics{
		connected: prometheus.NewGauge(prometheus.GaugeOpts(o("connected", "1 while a trainer's session is open."))),
		sessions:  prometheus.NewCounter(prometheus.CounterOpts(o("sessions_total", "Trainer sessions started."))),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts(o("sessions_refused_total",
			"Sessions refused, by reason: busy (a trainer is connected), model (another model than the job's), hello (a bad Hello), protocol.")), []string{"reason"}),
		calls: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "psp", Subsystem: "trainer", Name: "call_seconds",
			Help:    "Time the daemon took to answer a trainer's call, by call (barrier and step include the wait at the barrier).",
			Buckets: prometheus.ExponentialBuckets(0.00005, 2, 20)}, []string{"call"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts(o("call_errors_total", "Trainer calls answered with an error, by call and gRPC code.")), []string{"call", "code"}),
		refusedUpdates: prometheus.NewCounter(prometheus.CounterOpts(o("updates_refused_total",
			"Updates a trainer published that were refused (a value not finite or beyond the exchange's bound); nothing of them reached a peer."))),
		merged: prometheus.NewCounter(prometheus.CounterOpts(o("updates_merged_total", "Peer updates (gossip) or averages (epidemic) handed to the trainer by Pull."))),
		resets: prometheus.NewCounter(prometheus.CounterOpts(o("resets_total", "Times Pull handed the trainer the job's step and parameters in place of its own: the daemon moved to the job's lineage, or was far ahead of every peer."))),
		paramsRequests: prometheus.NewCounterVec(prometheus.CounterOpts(o("params_requests_total",
			"Requests to the trainer for its parameters (a peer fetching the model), by result: ok, timeout, bad, error.")), []string{"result"}),
	}
	if reg != nil {
		reg.MustRegister(m.connected, m.sessions, m.refused, m.calls, m.errors, m.refusedUpdates, m.merged, m.resets, m.paramsRequests)
	}
	return m
}
