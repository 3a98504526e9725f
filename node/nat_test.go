package node

import (
	"context"
	"encoding/json"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	"github.com/libp2p/go-libp2p/core/pnet"
	circuitclient "github.com/libp2p/go-libp2p/p2p/protocol/circuitv2/client"
	circuitproto "github.com/libp2p/go-libp2p/p2p/protocol/circuitv2/proto"
	"github.com/libp2p/go-libp2p/p2p/protocol/holepunch"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/pspnode/pspnode/internal/builtin"
	"github.com/pspnode/pspnode/internal/faults"
	"github.com/pspnode/pspnode/internal/wire"
	"github.com/pspnode/pspnode/model"
	"github.com/pspnode/pspnode/node/netsetup"
	"github.com/pspnode/pspnode/node/status"
)

// These tests build real hosts on TCP loopback. One machine has no NAT, so
// the nodes play one: the relay is fixed public (NATConfig.Reachability)
// and, through a test hook (faults.Host), announces its loopback address under a name AutoNAT and auto-relay count
// as public (as go-libp2p's own auto-relay tests do: a relay's private
// addresses never make /p2p-circuit addresses), and the node behind the
// "NAT" is fixed private and refuses every inbound connection that does not
// come through a relay.

// natConfig is a node without a model on TCP loopback with NAT traversal
// on (the default), joining through boot.
func natConfig(psk pnet.PSK, boot ...*Node) Config {
	cfg := tcpConfig()
	cfg.Job = "nattest"
	cfg.PSK = psk
	cfg.Check.QueryTimeout = 5 * time.Second
	for _, b := range boot {
		cfg.Bootstrap = append(cfg.Bootstrap, loopbackAddr(b))
	}
	return cfg
}

// loopbackAddr is a node's listen address on loopback with its peer ID: a
// relay announces only its public-looking name, which does not resolve.
func loopbackAddr(nd *Node) string {
	for _, a := range nd.Host().Network().ListenAddresses() {
		if strings.HasPrefix(a.String(), "/ip4/127.0.0.1/tcp/") {
			return a.String() + "/p2p/" + nd.ID().String()
		}
	}
	return ""
}

// publicRelay fixes a node public and has it announce its loopback
// addresses as /dns/libp2p.internal.
func publicRelay(cfg *Config) {
	cfg.NAT.Reachability = network.ReachabilityPublic
	faults.SetHost(cfg, faults.Host{
		Announce: func(addrs []ma.Multiaddr) []ma.Multiaddr {
			var out []ma.Multiaddr
			for _, a := range addrs {
				if rest, ok := strings.CutPrefix(a.String(), "/ip4/127.0.0.1"); ok {
					a = ma.StringCast("/dns/libp2p.internal" + rest)
				}
				out = append(out, a)
			}
			return out
		},
	})
}

// behindNAT fixes a node private and refuses direct inbound connections.
func behindNAT(cfg *Config) {
	cfg.NAT.Reachability = network.ReachabilityPrivate
	faults.SetHost(cfg, faults.Host{RefuseDirectInbound: true})
}

// waitRelay waits until nd serves as a relay.
func waitRelay(t *testing.T, nd *Node) {
	t.Helper()
	if !waitFor(10*time.Second, func() bool { return nd.NAT().RelayService }) {
		t.Fatalf("relay %s: no relay service after 10 s (status %+v)", nd.ID().ShortString(), nd.NAT())
	}
}

// A node behind a NAT reserves a slot at its bootstrap peer's relay and
// announces a /p2p-circuit address; a third node reaches it through the
// relay, a step query works over the relayed connection, and /status and
// /metrics report the connection as relayed and each node's reachability.
// With a swarm key the same holds: relayed connections carry it too.
func TestNATRelayedStepQuery(t *testing.T) {
	for _, tc := range []struct {
		name string
		psk  pnet.PSK
	}{{"open", nil}, {"swarm-key", newKey(t)}} {
		t.Run(tc.name, func(t *testing.T) {
			acfg := natConfig(tc.psk)
			publicRelay(&acfg)
			a := startNode(t, acfg)
			waitRelay(t, a)

			bcfg := natConfig(tc.psk, a)
			behindNAT(&bcfg)
			b := startNode(t, bcfg)
			var circuits []ma.Multiaddr
			if !waitFor(20*time.Second, func() bool {
				circuits = relayAddrs(b)
				return len(circuits) > 0
			}) {
				t.Fatalf("the node behind the NAT got no /p2p-circuit address (status %+v)", b.NAT())
			}
			for _, c := range circuits {
				if !strings.Contains(c.String(), "/p2p/"+a.ID().String()+"/p2p-circuit") {
					t.Errorf("relay address %s is not through the relay %s", c, a.ID())
				}
			}
			if st := b.Status().NAT; len(st.RelayAddrs) == 0 || st.Reachability != "private" {
				t.Errorf("status of the node behind the NAT: %+v, want relay addresses and reachability private", st)
			}
			if st := a.NAT(); st.Reachability != "public" || !st.RelayService {
				t.Errorf("relay status %+v: want public, relay service on", st)
			}

			c := startNode(t, natConfig(tc.psk, a))
			// C learns B's relay address (as it would from B's signed
			// record through the DHT) and asks B for its step.
			c.Host().Peerstore().AddAddrs(b.ID(), circuits, peerstore.TempAddrTTL)
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			if _, err := c.queryStep(ctx, b.ID(), wire.StepRequest{Step: 0}); err != nil {
				t.Fatalf("step query through the relay: %v", err)
			}
			relayedTo := func(nd *Node, p peer.ID) bool {
				for _, cn := range nd.Host().Network().ConnsToPeer(p) {
					if netsetup.IsRelayed(cn) {
						return true
					}
				}
				return false
			}
			if !relayedTo(c, b.ID()) {
				t.Fatalf("C's connection to B is not relayed: %v", c.Host().Network().ConnsToPeer(b.ID()))
			}
			// /status over HTTP counts it as relayed on both ends.
			for _, nd := range []*Node{b, c} {
				st := httpStatus(t, nd)
				if st.NAT.Connections.Relayed < 1 || !st.NAT.Traversal {
					t.Errorf("%s /status nat: %+v, want a relayed connection", nd.ID().ShortString(), st.NAT)
				}
			}
			if v := gaugeValue(t, b, "psp_connections", "kind", "relayed"); v < 1 {
				t.Errorf("psp_connections{kind=relayed} on B = %v, want >= 1", v)
			}
			if v := gaugeValue(t, b, "psp_reachability", "state", "private"); v != 1 {
				t.Errorf("psp_reachability{state=private} on B = %v, want 1", v)
			}
		})
	}
}

// gaugeValue reads a gauge's series with one label from a node's
// registry (-1 if absent).
func gaugeValue(t *testing.T, nd *Node, name, label, value string) float64 {
	t.Helper()
	mf := families(t, nd)[name]
	for _, m := range mf.GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == label && l.GetValue() == value {
				return m.GetGauge().GetValue()
			}
		}
	}
	return -1
}

// httpStatus reads a node's /status over HTTP.
func httpStatus(t *testing.T, nd *Node) status.Status {
	t.Helper()
	srv := httptest.NewServer(nd.Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st status.Status
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	return st
}

// A public node with the relay service off (--relay-service=false) serves
// no relay: a reservation at it is refused and the node behind the NAT
// that bootstraps through it gets no /p2p-circuit address.
func TestNATRelayServiceOff(t *testing.T) {
	acfg := natConfig(nil)
	acfg.NAT.RelayService = false
	publicRelay(&acfg)
	a := startNode(t, acfg)

	bcfg := natConfig(nil, a)
	behindNAT(&bcfg)
	b := startNode(t, bcfg)
	// Wait until B has identified A (it knows A's protocols): auto-relay
	// decides on them.
	if !waitFor(10*time.Second, func() bool {
		protos, err := b.Host().Peerstore().GetProtocols(a.ID())
		return err == nil && len(protos) > 0
	}) {
		t.Fatal("B never identified A")
	}
	if protos, _ := b.Host().Peerstore().GetProtocols(a.ID()); slices.Contains(protos, circuitproto.ProtoIDv2Hop) {
		t.Errorf("A offers the relay protocol with the relay service off: %v", protos)
	}
	if st := a.NAT(); st.RelayService || st.Reachability != "public" {
		t.Errorf("A's status %+v: want public, no relay service", st)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := circuitclient.Reserve(ctx, b.Host(), peer.AddrInfo{ID: a.ID()}); err == nil {
		t.Error("A granted a relay reservation with the relay service off")
	}
	if addrs := b.NAT().RelayAddrs; len(addrs) > 0 {
		t.Errorf("B got relay addresses through a node without the relay service: %v", addrs)
	}
	// The relay test's own control: the same node with the service on
	// grants it.
	if !testing.Short() {
		ccfg := natConfig(nil)
		publicRelay(&ccfg)
		c := startNode(t, ccfg)
		waitRelay(t, c)
		if err := b.Host().Connect(ctx, peer.AddrInfo{ID: c.ID(), Addrs: c.Host().Network().ListenAddresses()}); err != nil {
			t.Fatal(err)
		}
		if _, err := circuitclient.Reserve(ctx, b.Host(), peer.AddrInfo{ID: c.ID()}); err != nil {
			t.Errorf("a relay with the service on refused the reservation: %v", err)
		}
	}
}

// The hole puncher's events are counted by result, and the direct
// connections a successful punch opened count as hole_punched, not
// direct; a connection older than the punch does not, and a closed one is
// forgotten.
func TestNATHolePunchCounted(t *testing.T) {
	acfg := natConfig(nil)
	acfg.NAT = netsetup.NATConfig{}
	a := startNode(t, acfg)
	bcfg := natConfig(nil, a)
	bcfg.NAT = netsetup.NATConfig{}
	b := startNode(t, bcfg)
	conns := b.Host().Network().ConnsToPeer(a.ID())
	if len(conns) == 0 {
		t.Fatal("B is not connected to its bootstrap peer")
	}
	opened := conns[0].Stat().Opened
	punch := func(start time.Time, ok bool) {
		b.nat.Trace(&holepunch.Event{
			Timestamp: time.Now().UnixNano(), Remote: a.ID(), Type: holepunch.EndHolePunchEvtT,
			Evt: &holepunch.EndHolePunchEvt{Success: ok, EllapsedTime: time.Since(start)},
		})
	}
	punch(opened.Add(time.Millisecond), true) // began after the connection opened: not its maker
	punch(opened, false)
	b.nat.Trace(&holepunch.Event{Remote: a.ID(), Type: holepunch.DirectDialEvtT, Evt: &holepunch.DirectDialEvt{Success: true}})
	st := b.NAT()
	if st.Connections.HolePunched != 0 || st.Connections.Direct != len(conns) {
		t.Errorf("a connection older than the punch: %+v, want all %d direct", st.Connections, len(conns))
	}
	punch(opened.Add(-time.Millisecond), true)
	st = b.NAT()
	if st.Connections.HolePunched != len(conns) || st.Connections.Direct != 0 || st.Connections.Relayed != 0 {
		t.Errorf("after a punch that made the connection: %+v, want %d hole_punched", st.Connections, len(conns))
	}
	want := map[string]uint64{"success": 2, "failed": 1, "reversed": 1}
	if !maps.Equal(st.HolePunches, want) {
		t.Errorf("hole punches %v, want %v", st.HolePunches, want)
	}
	if v := gaugeValue(t, b, "psp_connections", "kind", "hole_punched"); v != float64(len(conns)) {
		t.Errorf("psp_connections{kind=hole_punched} = %v, want %d", v, len(conns))
	}
	if err := b.Host().Network().ClosePeer(a.ID()); err != nil {
		t.Fatal(err)
	}
	if !waitFor(5*time.Second, func() bool {
		return b.nat.Marked() == 0
	}) {
		t.Errorf("%d closed connections still marked hole-punched", b.nat.Marked())
	}
}

// A fixed reachability needs NAT traversal, and must be one of the three.
func TestNATConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		nat  netsetup.NATConfig
		want string // in the error; "" for none
	}{
		{netsetup.DefaultNATConfig(), ""},
		{netsetup.NATConfig{}, ""},
		{netsetup.NATConfig{Traversal: true, Reachability: network.ReachabilityPublic}, ""},
		{netsetup.NATConfig{Reachability: network.ReachabilityPrivate}, "reachability private needs NAT traversal"},
		{netsetup.NATConfig{Traversal: true, Reachability: 7}, "want unknown, public or private"},
		{netsetup.NATConfig{RelayService: true}, "relay service needs NAT traversal"},
	} {
		cfg := DefaultConfig()
		cfg.NAT = tc.nat
		err := cfg.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%+v: %v", tc.nat, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%+v: error %v, want %q", tc.nat, err, tc.want)
		}
	}
}

// A pair that reaches each other only through a relay (both behind the
// "NAT", and no hole punch: the second has NAT traversal off) carries more
// than step queries: a model fetch and the peek at a model's head (small
// enough for the relay's data limit), and the pool's joins, which make the
// peer a verified pool member. Before, each waited for a direct connection
// that never came, until its deadline: the model fetch failed (a joiner
// then trained from its own parameters) and the failed pool probe marked
// the peer dead.
func TestNATRelayedPairCarriesModelAndPool(t *testing.T) {
	data, err := model.Open("synthetic:regression")
	if err != nil {
		t.Fatal(err)
	}
	withModel := func(cfg Config, seed uint64) Option { // linreg: 21 parameters
		task, err := builtin.New(builtin.Spec{Model: "linreg", Shards: 1, SGD: model.DefaultSGDConfig(), Seed: seed, InitSeed: builtin.SeedOf(cfg.Job)}, data)
		if err != nil {
			t.Fatal(err)
		}
		return WithTask(task)
	}
	acfg := natConfig(nil)
	publicRelay(&acfg)
	a := startNode(t, acfg)
	waitRelay(t, a)

	bcfg := natConfig(nil, a)
	behindNAT(&bcfg)
	b := startNode(t, bcfg, withModel(bcfg, 2))
	var circuits []ma.Multiaddr
	if !waitFor(20*time.Second, func() bool {
		circuits = relayAddrs(b)
		return len(circuits) > 0
	}) {
		t.Fatalf("the node behind the NAT got no /p2p-circuit address (status %+v)", b.NAT())
	}
	ccfg := natConfig(nil, a)
	ccfg.NAT = netsetup.NATConfig{} // no hole punching: the pair stays relayed
	faults.SetHost(&ccfg, faults.Host{RefuseDirectInbound: true})
	c := startNode(t, ccfg, withModel(ccfg, 3))
	c.Host().Peerstore().AddAddrs(b.ID(), circuits, peerstore.TempAddrTTL)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if _, err := c.queryStep(ctx, b.ID(), wire.StepRequest{Step: 0}); err != nil {
		t.Fatalf("step query through the relay: %v", err)
	}
	for _, cn := range c.Host().Network().ConnsToPeer(b.ID()) {
		if !netsetup.IsRelayed(cn) {
			t.Fatalf("C has a direct connection to B: %v", cn.RemoteMultiaddr())
		}
	}
	mctx, mcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer mcancel()
	if err := c.mp.peek(mctx, b.ID()); err != nil {
		t.Errorf("peek at the model over the relayed connection: %v", err)
	}
	if _, _, err := c.mp.fetch(mctx, []peer.ID{b.ID()}, make([]float32, c.model.NumParams())); err != nil {
		t.Errorf("model fetch over the relayed connection: %v", err)
	}
	// C's pool join reaches B over the relayed connection: B counts two
	// pools that hold it, A's and C's, and C holds B live.
	if !waitFor(20*time.Second, func() bool { return b.Status().PoolInDegree >= 2 }) {
		t.Errorf("B is in %d pools, want 2 (A's and, over the relay, C's); B live in C's view: %v",
			b.Status().PoolInDegree, slices.Contains(c.Overlay().Peers(), b.ID()))
	}
	if !slices.Contains(c.Overlay().Peers(), b.ID()) {
		t.Error("C holds B dead")
	}
}

// relayAddrs are the /p2p-circuit addresses n announces.
func relayAddrs(n *Node) []ma.Multiaddr {
	var out []ma.Multiaddr
	for _, s := range n.NAT().RelayAddrs {
		out = append(out, ma.StringCast(s))
	}
	return out
}
