package exchange

import (
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/pspnode/pspnode/internal/wire"
)

// metrics are the exchange's Prometheus metrics (psp_exchange_*).
type metrics struct {
	sent, sentBytes, received, receivedBytes, merged, merges, clipped prometheus.Counter
	rejected, declined, sendFailed                                    *prometheus.CounterVec
}

// Send failures, by reason label.
const (
	sendUnsupported = "unsupported"       // the peer does not serve the exchange protocol
	sendMismatch    = "exchange_mismatch" // the peer runs another exchange
	sendRefused     = "refused"           // the peer refused the model after its blocks began (its reason is logged)
	sendDeclined    = "declined"          // the peer declined the model at its offer, before its bytes (another peer is tried)
	sendError       = "error"             // the stream failed or timed out
	sendSkipped     = "skipped"           // too many sends in flight already
	sendInvalid     = "invalid"           // this node's own model is not finite or not encodable
)

func newMetrics(reg prometheus.Registerer) *metrics {
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: "psp", Subsystem: "exchange", Name: name, Help: help})
	}
	m := &metrics{
		sent:          c("sent_total", "Models sent to peers and taken by them (epidemic exchange)."),
		sentBytes:     c("sent_bytes_total", "Bytes of models' blocks sent to peers, taken or not (epidemic exchange)."),
		received:      c("received_total", "Models received from peers and taken for averaging."),
		receivedBytes: c("received_bytes_total", "Encoded bytes of the models counted in psp_exchange_received_total."),
		merged:        c("averaged_models_total", "Received models averaged into this node's model."),
		merges:        c("averages_total", "Times this node averaged its model with received ones."),
		clipped:       c("clipped_models_total", "Received models whose pull on this node's model was clipped to the radius (the lower quartile of the senders' latest distances among the recent models) when averaged."),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "psp", Subsystem: "exchange", Name: "rejected_total",
			Help: "Models this node refused once their blocks began to come, by reason: non_finite, value_too_large, distance, bad_block, malformed (psp_exchange_declined_total counts the ones refused at their offer)."}, []string{"reason"}),
		declined: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "psp", Subsystem: "exchange", Name: "declined_total",
			Help: "Models this node was offered and refused at the offer, before any of their bytes, by reason: rate, other_lineage, no_model, exchange_mismatch, model_mismatch, wrong_length, step_too_far_ahead, ... (the sender offers them to another peer)."}, []string{"reason"}),
		sendFailed: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "psp", Subsystem: "exchange", Name: "send_failed_total",
			Help: "Models not delivered, by reason: unsupported, exchange_mismatch, refused (after its blocks began), declined (at its offer: another peer is tried), error, skipped, invalid."}, []string{"reason"}),
	}
	reg.MustRegister(m.sent, m.sentBytes, m.received, m.receivedBytes, m.merged, m.merges, m.clipped, m.rejected, m.declined, m.sendFailed)
	for _, r := range wire.ExchangeReasons() {
		m.rejected.WithLabelValues(string(r))
		m.declined.WithLabelValues(string(r))
	}
	for _, r := range []string{sendUnsupported, sendMismatch, sendRefused, sendDeclined, sendError, sendSkipped, sendInvalid} {
		m.sendFailed.WithLabelValues(r)
	}
	return m
}

// Stats counts what an exchange did (see the psp_exchange_* metrics).
type Stats struct {
	Exchange      string            `json:"exchange"`
	Sent          uint64            `json:"models_sent"`
	SentBytes     uint64            `json:"sent_bytes"`
	Received      uint64            `json:"models_received"`
	ReceivedBytes uint64            `json:"received_bytes"`
	Averaged      uint64            `json:"models_averaged"`
	Averages      uint64            `json:"averages"`
	Rejected      map[string]uint64 `json:"rejected,omitempty"`
	Declined      map[string]uint64 `json:"declined,omitempty"`
	SendFailed    map[string]uint64 `json:"send_failed,omitempty"`
}

// Stats returns the exchange's counts.
func (b *base) Stats() Stats {
	m := b.m
	st := Stats{Exchange: b.cfg.Spec.String()}
	st.Sent, st.SentBytes = uint64(counterValue(m.sent)), uint64(counterValue(m.sentBytes))
	st.Received, st.ReceivedBytes = uint64(counterValue(m.received)), uint64(counterValue(m.receivedBytes))
	st.Averaged, st.Averages = uint64(counterValue(m.merged)), uint64(counterValue(m.merges))
	vec := func(v *prometheus.CounterVec, labels []string) map[string]uint64 {
		out := map[string]uint64{}
		for _, l := range labels {
			if c := uint64(counterValue(v.WithLabelValues(l))); c > 0 {
				out[l] = c
			}
		}
		return out
	}
	var reasons []string
	for _, r := range wire.ExchangeReasons() {
		reasons = append(reasons, string(r))
	}
	st.Rejected = vec(m.rejected, reasons)
	st.Declined = vec(m.declined, reasons)
	st.SendFailed = vec(m.sendFailed, []string{sendUnsupported, sendMismatch, sendRefused, sendDeclined, sendError, sendSkipped})
	return st
}

// counterValue reads a counter's current value.
func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return 0
	}
	return m.GetCounter().GetValue()
}

// add adds v to c, if it is not nil.
func add(c prometheus.Counter, v float64) {
	if c != nil {
		c.Add(v)
	}
}

// observe observes v in o, if it is not nil.
func observe(o prometheus.Observer, v float64) {
	if o != nil {
		o.Observe(v)
	}
}
