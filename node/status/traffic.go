package status

import (
	"context"
	"strings"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pspnode/pspnode/internal/wire"
)

// Traffic accounting. A node counts the bytes its streams carry, in and
// out, by protocol class. The node wraps its host, built or given with
// WithHost: every stream it opens or accepts through the node, the
// overlay's DHT and pool, and GossipSub counts its reads and writes, in one
// counter per class. That is stream payload, protocol negotiation
// included; the security and multiplexer framing below the stream, and
// the streams of go-libp2p's own services (identify, ping), are not.
//
// go-libp2p's BandwidthCounter is not used: it keeps a meter per remote
// peer that is never freed unless trimmed (memory that grows with every
// peer ever seen), and its meters share a process-wide sweeper goroutine,
// which cannot run in a testing/synctest bubble (the testnet's virtual
// clock).

// Traffic classes, in the order of Classes.
const (
	classDHT = iota
	classStep
	classModel
	classGossip
	classPool
	classExchange
	classOther
	NumClasses // how many
)

// Classes names the protocol classes of Traffic.ByProtocol: the
// job's DHT, step, model, pool and exchange protocols, GossipSub
// (/meshsub/*, /floodsub/*), and every other protocol of the streams the
// node's wrapped host carries.
var Classes = [NumClasses]string{"dht", "step", "model", "gossip", "pool", "exchange", "other"}

// ProtocolTraffic is the bytes of one protocol class.
type ProtocolTraffic struct {
	InBytes  uint64 `json:"in_bytes"`
	OutBytes uint64 `json:"out_bytes"`
}

// Traffic is what a node's streams carried since it started.
type Traffic struct {
	InBytes  uint64 `json:"in_bytes"`
	OutBytes uint64 `json:"out_bytes"`
	// InBytesPerS and OutBytesPerS are the means since the node started;
	// InBytesPerStep divides InBytes by the node's step (0 before the
	// first).
	InBytesPerS    float64                    `json:"in_bytes_per_s"`
	OutBytesPerS   float64                    `json:"out_bytes_per_s"`
	InBytesPerStep float64                    `json:"in_bytes_per_step"`
	ByProtocol     map[string]ProtocolTraffic `json:"by_protocol"`
	// GossipPayloadBytes is the encoded size of the updates GossipSub
	// delivered to this node, and GossipAmplification the GossipSub bytes
	// that came in for them: ByProtocol["gossip"].InBytes ÷
	// GossipPayloadBytes (duplicates, control messages and envelopes
	// included; 0 before the first update).
	GossipPayloadBytes  uint64  `json:"gossip_payload_bytes"`
	GossipAmplification float64 `json:"gossip_amplification,omitempty"`
}

// Class returns the bytes of one class (see Classes).
func (t Traffic) Class(name string) ProtocolTraffic { return t.ByProtocol[name] }

// Sub returns t minus an earlier reading of the same node: the traffic in
// between (rates and per-step figures are left at zero).
func (t Traffic) Sub(earlier Traffic) Traffic {
	out := Traffic{
		InBytes:            t.InBytes - earlier.InBytes,
		OutBytes:           t.OutBytes - earlier.OutBytes,
		GossipPayloadBytes: t.GossipPayloadBytes - earlier.GossipPayloadBytes,
		ByProtocol:         make(map[string]ProtocolTraffic, len(t.ByProtocol)),
	}
	for k, v := range t.ByProtocol {
		e := earlier.ByProtocol[k]
		out.ByProtocol[k] = ProtocolTraffic{InBytes: v.InBytes - e.InBytes, OutBytes: v.OutBytes - e.OutBytes}
	}
	return out
}

// Meter counts a node's traffic by class.
type Meter struct {
	prefix string // "/psp/<job>/"
	in     [NumClasses]atomic.Uint64
	out    [NumClasses]atomic.Uint64
}

// NewMeter is the meter of a node of job.
func NewMeter(job string) *Meter { return &Meter{prefix: wire.JobPrefix(job)} }

// classOf maps a protocol ID to its class.
func (m *Meter) classOf(p protocol.ID) int {
	s := string(p)
	if rest, ok := strings.CutPrefix(s, m.prefix); ok {
		name, _, _ := strings.Cut(rest, "/")
		switch name {
		case "kad":
			return classDHT
		case "step":
			return classStep
		case "model":
			return classModel
		case "pool":
			return classPool
		case "exchange":
			return classExchange
		}
		return classOther
	}
	if strings.HasPrefix(s, "/meshsub/") || strings.HasPrefix(s, "/floodsub/") {
		return classGossip
	}
	return classOther
}

// Totals returns the bytes in and out by class.
func (m *Meter) Totals() (in, out [NumClasses]uint64) {
	for c := range NumClasses {
		in[c], out[c] = m.in[c].Load(), m.out[c].Load()
	}
	return in, out
}

// WrapHost returns h with every stream counted into m.
func (m *Meter) WrapHost(h host.Host) host.Host { return &countingHost{Host: h, m: m} }

// countingHost counts the streams it opens and the streams its handlers
// accept.
type countingHost struct {
	host.Host
	m *Meter
}

func (h *countingHost) NewStream(ctx context.Context, p peer.ID, pids ...protocol.ID) (network.Stream, error) {
	s, err := h.Host.NewStream(ctx, p, pids...)
	if err != nil {
		return s, err
	}
	return h.m.wrap(s), nil
}

func (h *countingHost) SetStreamHandler(pid protocol.ID, handler network.StreamHandler) {
	h.Host.SetStreamHandler(pid, func(s network.Stream) { handler(h.m.wrap(s)) })
}

func (h *countingHost) SetStreamHandlerMatch(pid protocol.ID, match func(protocol.ID) bool, handler network.StreamHandler) {
	h.Host.SetStreamHandlerMatch(pid, match, func(s network.Stream) { handler(h.m.wrap(s)) })
}

func (m *Meter) wrap(s network.Stream) network.Stream {
	cs := &countedStream{Stream: s, m: m}
	cs.class.Store(-1)
	return cs
}

// countedStream adds its reads and writes to its class. The class is the
// stream's protocol, known once negotiation chose it (an outbound stream
// may be handed over before: the bytes until then count as other).
type countedStream struct {
	network.Stream
	m     *Meter
	class atomic.Int32 // -1 until the protocol is known
}

func (s *countedStream) classNow() int {
	if c := s.class.Load(); c >= 0 {
		return int(c)
	}
	p := s.Stream.Protocol()
	if p == "" {
		return classOther
	}
	c := s.m.classOf(p)
	s.class.Store(int32(c))
	return c
}

func (s *countedStream) Read(b []byte) (int, error) {
	n, err := s.Stream.Read(b)
	if n > 0 {
		s.m.in[s.classNow()].Add(uint64(n))
	}
	return n, err
}

func (s *countedStream) Write(b []byte) (int, error) {
	n, err := s.Stream.Write(b)
	if n > 0 {
		s.m.out[s.classNow()].Add(uint64(n))
	}
	return n, err
}

// Traffic is what the meter counted since started, for a node at step
// whose gossip topic delivered gossipPayload bytes of updates.
func (m *Meter) Traffic(started time.Time, step int64, gossipPayload uint64) Traffic {
	in, out := m.Totals()
	t := Traffic{ByProtocol: make(map[string]ProtocolTraffic, NumClasses)}
	for c, name := range Classes {
		t.InBytes += in[c]
		t.OutBytes += out[c]
		t.ByProtocol[name] = ProtocolTraffic{InBytes: in[c], OutBytes: out[c]}
	}
	if up := time.Since(started).Seconds(); up > 0 {
		t.InBytesPerS, t.OutBytesPerS = float64(t.InBytes)/up, float64(t.OutBytes)/up
	}
	if step > 0 {
		t.InBytesPerStep = float64(t.InBytes) / float64(step)
	}
	t.GossipPayloadBytes = gossipPayload
	if t.GossipPayloadBytes > 0 {
		t.GossipAmplification = float64(in[classGossip]) / float64(t.GossipPayloadBytes)
	}
	return t
}

// Collector exports the meter as psp_traffic_bytes_total{direction,
// protocol}, and psp_gossip_amplification, read when /metrics is scraped.
// gossipPayload says the update payload the gossip topic delivered.
func (m *Meter) Collector(gossipPayload func() uint64) prometheus.Collector {
	return &trafficCollector{m: m, payload: gossipPayload,
		bytes: prometheus.NewDesc("psp_traffic_bytes_total",
			"Bytes the node's streams carried, by direction (in, out) and protocol class (dht, step, model, gossip, pool, exchange, other).",
			[]string{"direction", "protocol"}, nil),
		amp: prometheus.NewDesc("psp_gossip_amplification",
			"GossipSub bytes received per byte of update payload delivered (0 before the first update).", nil, nil),
	}
}

type trafficCollector struct {
	m          *Meter
	payload    func() uint64
	bytes, amp *prometheus.Desc
}

func (c *trafficCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.bytes; ch <- c.amp }

func (c *trafficCollector) Collect(ch chan<- prometheus.Metric) {
	in, out := c.m.Totals()
	for i, name := range Classes {
		ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.CounterValue, float64(in[i]), "in", name)
		ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.CounterValue, float64(out[i]), "out", name)
	}
	amp := 0.0
	if p := c.payload(); p > 0 {
		amp = float64(in[classGossip]) / float64(p)
	}
	ch <- prometheus.MustNewConstMetric(c.amp, prometheus.GaugeValue, amp)
}
