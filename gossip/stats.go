package gossip

import (
	"errors"
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Stats is a snapshot of a Gossip's counters.
type Stats struct {
	Sent          uint64 // updates published
	SentBytes     uint64 // their total encoded size
	LastSentBytes int    // encoded size of the latest published update
	// Clamped counts published values that were clamped to ±MaxAbsValue
	// (or to the float16 range); the clamped-off part went into the
	// error-feedback residual, to be sent in later updates.
	Clamped       uint64
	Received      uint64 // valid updates from others delivered to handlers
	ReceivedBytes uint64 // their total encoded size
	// Rejected counts dropped incoming messages by reason (rejected and
	// ignored alike; see Reason.Ignore). Reasons never seen are absent.
	Rejected map[Reason]uint64
	// Declined counts, for an exchange whose models are offered before
	// they are sent (epidemic), the offers refused before any of their
	// bytes came, by reason; nil under gossip.
	Declined map[Reason]uint64
}

// MeanSentBytes is the mean encoded size of a published update (0 if none).
func (s Stats) MeanSentBytes() float64 {
	if s.Sent == 0 {
		return 0
	}
	return float64(s.SentBytes) / float64(s.Sent)
}

// MeanReceivedBytes is the mean encoded size of a received update (0 if none).
func (s Stats) MeanReceivedBytes() float64 {
	if s.Received == 0 {
		return 0
	}
	return float64(s.ReceivedBytes) / float64(s.Received)
}

// TotalRejected sums Rejected.
func (s Stats) TotalRejected() uint64 {
	var t uint64
	for _, c := range s.Rejected {
		t += c
	}
	return t
}

type counters struct {
	mu sync.Mutex
	s  Stats

	// optional prometheus mirrors
	sent, sentBytes, clamped, recv, recvBytes prometheus.Counter
	rejected                                  *prometheus.CounterVec
	collectors                                []prometheus.Collector
	reg                                       prometheus.Registerer
}

func newCounters(reg prometheus.Registerer) (*counters, error) {
	c := &counters{s: Stats{Rejected: map[Reason]uint64{}}}
	if reg == nil {
		return c, nil
	}
	c.sent = prometheus.NewCounter(prometheus.CounterOpts{Namespace: "psp", Subsystem: "gossip", Name: "sent_updates_total", Help: "Model updates published."})
	c.sentBytes = prometheus.NewCounter(prometheus.CounterOpts{Namespace: "psp", Subsystem: "gossip", Name: "sent_bytes_total", Help: "Encoded bytes of published model updates."})
	c.clamped = prometheus.NewCounter(prometheus.CounterOpts{Namespace: "psp", Subsystem: "gossip", Name: "clamped_values_total", Help: "Values of published model updates clamped to MaxAbsValue (the rest is sent later)."})
	c.recv = prometheus.NewCounter(prometheus.CounterOpts{Namespace: "psp", Subsystem: "gossip", Name: "received_updates_total", Help: "Valid model updates received from peers."})
	c.recvBytes = prometheus.NewCounter(prometheus.CounterOpts{Namespace: "psp", Subsystem: "gossip", Name: "received_bytes_total", Help: "Encoded bytes of valid model updates received."})
	c.rejected = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "psp", Subsystem: "gossip", Name: "rejected_updates_total", Help: "Incoming update messages dropped, by reason."}, []string{"reason"})
	for _, r := range Reasons {
		c.rejected.WithLabelValues(string(r)) // export zeros
	}
	c.collectors = []prometheus.Collector{c.sent, c.sentBytes, c.clamped, c.recv, c.recvBytes, c.rejected}
	for i, col := range c.collectors {
		if err := reg.Register(col); err != nil {
			for _, done := range c.collectors[:i] {
				reg.Unregister(done)
			}
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				return nil, fmt.Errorf("gossip: metrics already registered (wrap the registerer with per-node labels, e.g. prometheus.WrapRegistererWith): %w", err)
			}
			return nil, fmt.Errorf("gossip: register metrics: %w", err)
		}
	}
	c.reg = reg
	return c, nil
}

func (c *counters) unregister() {
	if c.reg == nil {
		return
	}
	for _, col := range c.collectors {
		c.reg.Unregister(col)
	}
	c.reg = nil
}

// addSent counts one published update of n bytes, clamped of whose values
// were clamped.
func (c *counters) addSent(n, clamped int) {
	c.mu.Lock()
	c.s.Sent++
	c.s.SentBytes += uint64(n)
	c.s.LastSentBytes = n
	c.s.Clamped += uint64(clamped)
	c.mu.Unlock()
	if c.sent != nil {
		c.sent.Inc()
		c.sentBytes.Add(float64(n))
		c.clamped.Add(float64(clamped))
	}
}

func (c *counters) addReceived(n int) {
	c.mu.Lock()
	c.s.Received++
	c.s.ReceivedBytes += uint64(n)
	c.mu.Unlock()
	if c.recv != nil {
		c.recv.Inc()
		c.recvBytes.Add(float64(n))
	}
}

func (c *counters) addRejected(r Reason) {
	c.mu.Lock()
	c.s.Rejected[r]++
	c.mu.Unlock()
	if c.rejected != nil {
		c.rejected.WithLabelValues(string(r)).Inc()
	}
}

func (c *counters) snapshot() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.s
	s.Rejected = make(map[Reason]uint64, len(c.s.Rejected))
	for k, v := range c.s.Rejected {
		s.Rejected[k] = v
	}
	return s
}
