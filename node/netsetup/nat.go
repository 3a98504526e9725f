package netsetup

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/host/autorelay"
	circuitproto "github.com/libp2p/go-libp2p/p2p/protocol/circuitv2/proto"
	relayv2 "github.com/libp2p/go-libp2p/p2p/protocol/circuitv2/relay"
	"github.com/libp2p/go-libp2p/p2p/protocol/holepunch"
	ma "github.com/multiformats/go-multiaddr"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// NAT traversal, all of it go-libp2p's own services:
//
//   - AutoNAT. Each node asks its peers to dial it back and learns whether
//     it is reachable: AutoNAT v1 gives the host's reachability (public,
//     private, unknown), which go-libp2p's relay service and auto-relay
//     follow; AutoNAT v2 confirms each address on its own (reachable_addrs
//     in /status). Each node also answers its peers' dial-back requests
//     (rate-limited by go-libp2p), so a job needs no outside AutoNAT
//     servers. Both only test public addresses.
//   - Circuit relay v2. A node AutoNAT finds public offers a relay with
//     go-libp2p's default limits (relayv2.DefaultResources: 128
//     reservations, 16 circuits per peer, each relayed connection reset
//     after 2 minutes or 128 KiB each way), unless NATConfig.RelayService is
//     off. Relayed connections are "limited": only small streams run over
//     them (see OverRelay); the others wait for a direct connection.
//   - Auto-relay. A node AutoNAT finds private reserves a slot at its
//     bootstrap peers (those that offer the service) and announces the
//     /p2p-circuit addresses through them. A node without bootstrap peers
//     has no relays.
//   - Hole punching (DCUtR). When a peer reaches a node over a relay, the
//     two try to connect directly: a dial if one side is public, else a
//     simultaneous open through both NATs, coordinated over the relay.
//
// Everything runs over TCP too, so a private job (a swarm key: TCP only)
// relays and punches holes the same way; relayed connections are upgraded
// with the key like any other.

// relayDataLimit is what a relay lets one relayed connection carry each
// way before it resets it: go-libp2p's default (relayv2.DefaultLimit),
// which a pspnode relay keeps.
var relayDataLimit = relayv2.DefaultLimit().Data

// OverRelay lets a stream that carries up to size bytes each way run over
// a relayed (limited) connection when that fits in half the relay's data
// limit (the step queries of the pair share the rest): go-libp2p opens
// streams only on direct connections unless told, and two peers behind
// NATs whose hole punch failed have none, so the stream waited for one
// until its deadline. A larger stream waits for a direct connection, as
// before.
//
// Over a relayed pair run: step queries (package node), the model
// protocol for models up to about 8 000 parameters (a fetch, and the peek
// at a model's head), the pool's joins and leaves and the overlay's DHT
// lookups (overlay: a few bytes, a few kilobytes). Not: the epidemic
// exchange (a whole model every step would spend the relay's limit at
// once), GossipSub (go-libp2p-pubsub opens no stream over a limited
// connection; updates come through the pair's direct peers), and
// go-libp2p-kad-dht's own queries.
func OverRelay(ctx context.Context, size int, why string) context.Context {
	if int64(size) > relayDataLimit/2 {
		return ctx
	}
	return network.WithAllowLimitedConn(ctx, why)
}

// NATConfig turns NAT traversal on. It applies to a host the node builds
// (not one given with WithHost).
type NATConfig struct {
	// Traversal turns on AutoNAT v1 and v2 (client and service), auto-relay
	// through the bootstrap peers and hole punching. Off, the host runs
	// none of them (it can still dial a /p2p-circuit address it is given).
	Traversal bool
	// RelayService makes a node that AutoNAT finds public offer a limited
	// circuit relay. It needs Traversal: without AutoNAT nothing finds the
	// node public.
	RelayService bool
	// Reachability, if ReachabilityPublic or ReachabilityPrivate, fixes
	// the node's reachability instead of letting AutoNAT find it (it needs
	// Traversal). Public suits a node known to be reachable, such as a
	// job's one public bootstrap node: it relays at once, whether or not
	// its peers could tell (AutoNAT needs a public peer that answers
	// dial-backs, and go-libp2p stops a node answering them once it finds
	// itself private). Private makes a node known to be behind a NAT use
	// relays at once. ReachabilityUnknown (the zero value) lets AutoNAT
	// find out.
	Reachability network.Reachability
}

// DefaultNATConfig turns everything on and lets AutoNAT find the node's
// reachability.
func DefaultNATConfig() NATConfig { return NATConfig{Traversal: true, RelayService: true} }

// Validate checks c: the relay service and a fixed reachability need
// traversal.
func (c NATConfig) Validate() error {
	if c.RelayService && !c.Traversal {
		return errors.New("NAT.RelayService: the relay service needs NAT traversal (it starts when AutoNAT finds the node public)")
	}
	switch c.Reachability {
	case network.ReachabilityUnknown:
	case network.ReachabilityPublic, network.ReachabilityPrivate:
		if !c.Traversal {
			return fmt.Errorf("NAT.Reachability: reachability %s needs NAT traversal", reachabilityName(c.Reachability))
		}
	default:
		return fmt.Errorf("NAT.Reachability %d: want unknown, public or private", c.Reachability)
	}
	return nil
}

// NAT follows a host's reachability, relays and hole punches, for the
// node's status and metrics. Its host options (HostOptions) turn NAT
// traversal on.
type NAT struct {
	h       host.Host // the host as built, before the traffic wrapper
	punches *prometheus.CounterVec
	mu      sync.Mutex
	punched map[string]bool // IDs of direct connections a hole punch made
}

// Hole-punch outcomes (the result label of psp_hole_punches_total).
const (
	punchSuccess  = "success"  // a simultaneous open made a direct connection
	punchFailed   = "failed"   // one attempt failed (a punch makes up to three)
	punchReversed = "reversed" // the direct dial before punching worked: no punch needed
)

// NewNAT makes a NAT whose metrics (psp_hole_punches_total, and gauges
// of reachability, connections by kind and relays) are registered in reg.
func NewNAT(reg prometheus.Registerer) *NAT {
	s := &NAT{
		punched: make(map[string]bool),
		punches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "psp", Name: "hole_punches_total",
			Help: "Hole-punch (DCUtR) attempts with peers that reached this node over a relay or that it reached over one, by result: success (a direct connection), failed (one attempt of up to three), reversed (a direct dial worked before punching).",
		}, []string{"result"}),
	}
	for _, r := range []string{punchSuccess, punchFailed, punchReversed} {
		s.punches.WithLabelValues(r) // export zeros
	}
	reg.MustRegister(s.punches, &natCollector{s: s})
	return s
}

// HostOptions are the libp2p options of c (AutoNAT, relays and hole
// punching) for a host whose relays are its bootstrap peers, relays (the
// host itself left out); go-libp2p's hole-punch metrics go to reg.
func (s *NAT) HostOptions(c NATConfig, relays []peer.AddrInfo, reg prometheus.Registerer) []libp2p.Option {
	var opts []libp2p.Option
	if !c.Traversal {
		return opts
	}
	switch c.Reachability {
	case network.ReachabilityPublic:
		opts = append(opts, libp2p.ForceReachabilityPublic())
	case network.ReachabilityPrivate:
		opts = append(opts, libp2p.ForceReachabilityPrivate())
	}
	opts = append(opts,
		libp2p.EnableAutoNATv2(),
		libp2p.EnableNATService(),
		// Keep go-libp2p's hole-punch metrics (libp2p_holepunch_*) and
		// hear of every punch too.
		libp2p.EnableHolePunching(holepunch.WithMetricsAndEventTracer(
			holepunch.NewMetricsTracer(holepunch.WithRegisterer(reg)), s)),
	)
	if c.RelayService {
		opts = append(opts, libp2p.EnableRelayService(relayv2.WithResources(relayv2.DefaultResources())))
	}
	if len(relays) > 0 {
		opts = append(opts, libp2p.EnableAutoRelayWithStaticRelays(relays,
			// The relays are fixed: reserve at once rather than wait
			// (3 min by default) for candidates to choose from, and ask
			// again soon after a bootstrap peer that offered no relay
			// (AutoNAT had not found it public yet).
			autorelay.WithBootDelay(0),
			autorelay.WithMinInterval(15*time.Second),
		))
	}
	return opts
}

// Trace is the hole puncher's event tracer (holepunch.EventTracer): it
// counts punches, and marks the direct connections a successful punch
// opened so that /status can tell them from other direct connections.
func (s *NAT) Trace(evt *holepunch.Event) {
	switch e := evt.Evt.(type) {
	case *holepunch.EndHolePunchEvt:
		if !e.Success {
			s.punches.WithLabelValues(punchFailed).Inc()
			return
		}
		s.punches.WithLabelValues(punchSuccess).Inc()
		start := time.Unix(0, evt.Timestamp).Add(-e.EllapsedTime)
		h := s.host()
		if h == nil {
			return
		}
		conns := h.Network().ConnsToPeer(evt.Remote) // not under s.mu: the swarm locks inside
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, c := range conns {
			if !IsRelayed(c) && !c.Stat().Opened.Before(start) {
				s.punched[c.ID()] = true
			}
		}
	case *holepunch.DirectDialEvt:
		if e.Success {
			s.punches.WithLabelValues(punchReversed).Inc()
		}
	}
}

// Attach gives s the host to read (the host as built: its Reachability
// and ConfirmedAddrs are not on the host.Host interface).
func (s *NAT) Attach(h host.Host) {
	s.mu.Lock()
	s.h = h
	s.mu.Unlock()
}

// Closed forgets a closed connection.
func (s *NAT) Closed(c network.Conn) {
	s.mu.Lock()
	delete(s.punched, c.ID())
	s.mu.Unlock()
}

// IsRelayed says whether c runs through a relay: limited by the relay, or
// with a /p2p-circuit remote address (an unlimited relay's).
func IsRelayed(c network.Conn) bool {
	return c.Stat().Limited || isCircuit(c.RemoteMultiaddr())
}

func isCircuit(a ma.Multiaddr) bool {
	for _, c := range a {
		if c.Protocol().Code == ma.P_CIRCUIT {
			return true
		}
	}
	return false
}

// ConnKinds counts open connections by how they run.
type ConnKinds struct {
	// Direct connections, not made by a hole punch.
	Direct int `json:"direct"`
	// Relayed connections, through a circuit relay.
	Relayed int `json:"relayed"`
	// HolePunched: direct connections a hole punch made.
	HolePunched int `json:"hole_punched"`
}

// NATStatus is the NAT part of /status.
type NATStatus struct {
	// Traversal: AutoNAT, auto-relay and hole punching are on.
	Traversal bool `json:"traversal"`
	// Reachability is AutoNAT's verdict on the host: public, private or
	// unknown (not yet tested, or no public address to test).
	Reachability string `json:"reachability"`
	// ReachableAddrs are the addresses AutoNAT v2 confirmed dialable.
	ReachableAddrs []string `json:"reachable_addrs,omitempty"`
	// RelayAddrs are the /p2p-circuit addresses the host announces: it
	// holds a reservation at each of their relays.
	RelayAddrs []string `json:"relay_addrs,omitempty"`
	// RelayService: the node serves as a relay at this moment (it offers the
	// service and AutoNAT found it public).
	RelayService bool      `json:"relay_service"`
	Connections  ConnKinds `json:"connections"`
	// HolePunches counts hole-punch attempts by result (see
	// psp_hole_punches_total).
	HolePunches map[string]uint64 `json:"hole_punches"`
}

// reachability reads the host's reachability ("unknown" for a host that
// does not say).
func (s *NAT) reachability() network.Reachability {
	if r, ok := s.host().(interface{ Reachability() network.Reachability }); ok {
		return r.Reachability()
	}
	return network.ReachabilityUnknown
}

func (s *NAT) host() host.Host {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.h
}

// relayServing says whether the host serves the relay protocol at the
// moment.
func (s *NAT) relayServing() bool {
	h := s.host()
	return h != nil && slices.Contains(h.Mux().Protocols(), circuitproto.ProtoIDv2Hop)
}

// relayAddrs are the host's /p2p-circuit addresses.
func (s *NAT) relayAddrs() []ma.Multiaddr {
	h := s.host()
	if h == nil {
		return nil
	}
	var out []ma.Multiaddr
	for _, a := range h.Addrs() {
		if isCircuit(a) {
			out = append(out, a)
		}
	}
	return out
}

// conns counts the host's open connections by kind, and forgets marks on
// connections that have closed.
func (s *NAT) conns() ConnKinds {
	h := s.host()
	if h == nil {
		return ConnKinds{}
	}
	cs := h.Network().Conns()
	var k ConnKinds
	s.mu.Lock()
	defer s.mu.Unlock()
	live := make(map[string]bool, len(s.punched))
	for _, c := range cs {
		switch {
		case IsRelayed(c):
			k.Relayed++
		case s.punched[c.ID()]:
			k.HolePunched++
			live[c.ID()] = true
		default:
			k.Direct++
		}
	}
	if len(live) < len(s.punched) {
		s.punched = live // a mark set as its connection closed
	}
	return k
}

// Status is the NAT part of the node's status; traversal says whether
// the host runs NAT traversal (HostOptions with it on).
func (s *NAT) Status(traversal bool) NATStatus {
	st := NATStatus{
		Traversal:    traversal,
		Reachability: reachabilityName(s.reachability()),
		RelayService: s.relayServing(),
		Connections:  s.conns(),
	}
	for _, a := range s.relayAddrs() {
		st.RelayAddrs = append(st.RelayAddrs, a.String())
	}
	if c, ok := s.host().(interface {
		ConfirmedAddrs() (reachable, unreachable, unknown []ma.Multiaddr)
	}); ok && traversal {
		reachable, _, _ := c.ConfirmedAddrs()
		for _, a := range reachable {
			st.ReachableAddrs = append(st.ReachableAddrs, a.String())
		}
	}
	st.HolePunches = make(map[string]uint64, 3)
	for _, r := range []string{punchSuccess, punchFailed, punchReversed} {
		st.HolePunches[r] = uint64(counterValue(s.punches.WithLabelValues(r)))
	}
	return st
}

func reachabilityName(r network.Reachability) string {
	switch r {
	case network.ReachabilityPublic:
		return "public"
	case network.ReachabilityPrivate:
		return "private"
	}
	return "unknown"
}

// natCollector exports the NAT gauges, read when scraped.
type natCollector struct{ s *NAT }

var (
	reachabilityDesc = prometheus.NewDesc("psp_reachability",
		"1 for the node's reachability as AutoNAT finds it (state: public, private, unknown), 0 for the others.",
		[]string{"state"}, nil)
	connKindsDesc = prometheus.NewDesc("psp_connections",
		"Open connections by kind: direct, relayed (through a circuit relay), hole_punched (direct, made by a hole punch).",
		[]string{"kind"}, nil)
	relayAddrsDesc = prometheus.NewDesc("psp_relay_addresses",
		"The /p2p-circuit addresses the node announces (one or more per relay it holds a reservation at).", nil, nil)
	relayServiceDesc = prometheus.NewDesc("psp_relay_service_active",
		"1 while the node serves as a circuit relay (it offers the service and AutoNAT found it public).", nil, nil)
)

func (c *natCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- reachabilityDesc
	ch <- connKindsDesc
	ch <- relayAddrsDesc
	ch <- relayServiceDesc
}

func (c *natCollector) Collect(ch chan<- prometheus.Metric) {
	r := reachabilityName(c.s.reachability())
	for _, state := range []string{"public", "private", "unknown"} {
		v := 0.0
		if state == r {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(reachabilityDesc, prometheus.GaugeValue, v, state)
	}
	k := c.s.conns()
	ch <- prometheus.MustNewConstMetric(connKindsDesc, prometheus.GaugeValue, float64(k.Direct), "direct")
	ch <- prometheus.MustNewConstMetric(connKindsDesc, prometheus.GaugeValue, float64(k.Relayed), "relayed")
	ch <- prometheus.MustNewConstMetric(connKindsDesc, prometheus.GaugeValue, float64(k.HolePunched), "hole_punched")
	ch <- prometheus.MustNewConstMetric(relayAddrsDesc, prometheus.GaugeValue, float64(len(c.s.relayAddrs())))
	serving := 0.0
	if c.s.relayServing() {
		serving = 1
	}
	ch <- prometheus.MustNewConstMetric(relayServiceDesc, prometheus.GaugeValue, serving)
}

// Marked counts the connections marked as made by a hole punch, closed
// ones not yet forgotten: a test reads it to see Closed forget them.
func (s *NAT) Marked() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.punched)
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return 0
	}
	return m.GetCounter().GetValue()
}
