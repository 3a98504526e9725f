package overlay

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/net/connmgr"

	"github.com/pspnode/pspnode/internal/memnet"
	"github.com/pspnode/pspnode/internal/vclock"
)

// memOverlays starts n overlays on a fresh in-memory network (hosts with
// connection-manager watermarks low and high), each joining through the
// first node and the one before it, with fastConfig(job) and Seed i+1
// adjusted by tune (which may be nil) for node i. The hosts' keys are the
// same every run (seeded memnet). Everything is closed when the test ends.
// Call it inside a synctest bubble, so that the test runs on a virtual
// clock.
func memOverlays(t *testing.T, n int, job string, low, high int, tune func(i int, cfg *Config)) (*memnet.Net, []*Overlay) {
	t.Helper()
	net := memnet.NewNet(memnet.Config{Seed: 1}) // the same host keys every run
	t.Cleanup(func() { _ = net.Close() })
	hosts := make([]*memnet.Host, n)
	for i := range hosts {
		h, err := net.NewHost(low, high)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = h.Close() })
		hosts[i] = h
	}
	var nodes []*Overlay
	for i, h := range hosts {
		cfg := fastConfig(job)
		cfg.Seed = uint64(i) + 1
		if i > 0 {
			cfg.BootstrapPeers = []peer.AddrInfo{{ID: hosts[0].ID()}}
			if i > 1 {
				cfg.BootstrapPeers = append(cfg.BootstrapPeers, peer.AddrInfo{ID: hosts[i-1].ID()})
			}
		}
		if tune != nil {
			tune(i, &cfg)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		o, err := New(ctx, h, cfg)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = o.Close() })
		nodes = append(nodes, o)
	}
	return net, nodes
}

// fastConfig shortens every period so an in-process test converges in
// seconds.
func fastConfig(job string, boot ...peer.AddrInfo) Config {
	cfg := DefaultConfig()
	cfg.Job = job
	cfg.BootstrapPeers = boot
	cfg.RefreshInterval = 5 * time.Second
	cfg.WalkInterval = 500 * time.Millisecond
	cfg.WarmupWalkInterval = 200 * time.Millisecond
	cfg.WarmupPeriod = 3 * time.Second
	cfg.QueryTimeout = 3 * time.Second
	cfg.JoinTimeout = 5 * time.Second
	cfg.RotateInterval = 200 * time.Millisecond
	cfg.MaintainInterval = time.Second
	cfg.ProbeTimeout = time.Second
	cfg.EstimateWindow = 10 * time.Second
	return cfg
}

func tcpHost(t *testing.T, key crypto.PrivKey) host.Host {
	t.Helper()
	h, err := tcpHostB(key)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// tcpHostB builds a TCP-loopback host with a connection manager, as a real
// node would have.
// The TCP hosts' connection-manager watermarks.
const tcpConnLow, tcpConnHigh = 50, 100

func tcpHostB(key crypto.PrivKey) (host.Host, error) {
	cm, err := connmgr.NewConnManager(tcpConnLow, tcpConnHigh)
	if err != nil {
		return nil, err
	}
	opts := []libp2p.Option{
		libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"),
		libp2p.ConnectionManager(cm),
		libp2p.DisableRelay(),
	}
	if key != nil {
		opts = append(opts, libp2p.Identity(key))
	}
	return libp2p.New(opts...)
}

type tnode struct {
	h   host.Host
	o   *Overlay
	key crypto.PrivKey
}

func (n *tnode) stop() {
	_ = n.o.Close()
	_ = n.h.Close()
}

func startNode(t *testing.T, job string, key crypto.PrivKey, boot ...peer.AddrInfo) *tnode {
	t.Helper()
	h := tcpHost(t, key)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	o, err := New(ctx, h, fastConfig(job, boot...))
	if err != nil {
		_ = h.Close()
		t.Fatal(err)
	}
	return &tnode{h: h, o: o, key: key}
}

// bubble runs f in a synctest bubble: on a virtual clock that advances only
// when every goroutine of the test is blocked, so that no deadline of the
// overlay or of the test can pass because the machine is busy. (Under the
// race detector with one P: see vclock.Test.)
func bubble(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	vclock.Test(t, f)
}

// eventually polls cond every 100 ms until it holds or d passes. In a
// synctest bubble the clock is virtual: d bounds the protocol's own time,
// and the machine's load cannot use it up.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	start := time.Now()
	deadline := start.Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("%s after %v", what, time.Since(start).Round(time.Millisecond))
}

// settled reports whether every node estimates n within ±1 and holds a
// pool of at least pool verified peers.
func settled(nodes []*Overlay, n, pool int) bool {
	for _, o := range nodes {
		est, _, err := o.Estimate()
		if err != nil || math.Abs(est-float64(n)) > 1 || o.Status().Pool < pool {
			return false
		}
	}
	return true
}

// knows reports whether every node has p among its live peers.
func knows(nodes []*Overlay, p peer.ID) bool {
	for _, o := range nodes {
		if !slices.Contains(o.Peers(), p) {
			return false
		}
	}
	return true
}

// forgotten reports whether no node has p among its live peers and every
// pool holds pool verified peers.
func forgotten(nodes []*Overlay, p peer.ID, pool int) bool {
	for _, o := range nodes {
		if slices.Contains(o.Peers(), p) || o.Status().Pool != pool {
			return false
		}
	}
	return true
}

// checkSamples draws 20 samples of 5 at each node and checks that they are
// distinct peers of the network (all), never the node itself or banned.
func checkSamples(t *testing.T, nodes []*Overlay, all map[peer.ID]bool, banned peer.ID) {
	t.Helper()
	for _, o := range nodes {
		for range 20 {
			s, err := o.Sample(context.Background(), 5)
			if err != nil {
				t.Fatalf("sample: %v", err)
			}
			seen := make(map[peer.ID]bool)
			for _, p := range s {
				switch {
				case p == o.h.ID():
					t.Fatal("self in sample")
				case seen[p]:
					t.Fatal("duplicate in sample")
				case !all[p]:
					t.Fatalf("unknown peer %s in sample", p)
				case p == banned:
					t.Fatalf("departed peer %s sampled", p.ShortString())
				}
				seen[p] = true
			}
		}
	}
}

// TestIntegrationMem runs 12 in-memory overlays on a virtual clock: they
// join, estimate N exactly and fill their pools within 25 s, sample
// distinct live non-self peers, and after one node leaves abruptly nobody
// samples it within 10 s and every estimate reads N-1 within 15 s more.
// The bounds are on the protocol's time (fastConfig's periods), which a
// busy machine cannot stretch. TestIntegrationTCP runs the same story over
// real TCP.
func TestIntegrationMem(t *testing.T) { bubble(t, testIntegrationMem) }

func testIntegrationMem(t *testing.T) {
	const n = 12
	_, nodes := memOverlays(t, n, "itest", 100, 200, nil)
	all := make(map[peer.ID]bool)
	for _, o := range nodes {
		all[o.h.ID()] = true
	}
	eventually(t, 25*time.Second, "estimates within ±1 of N and full pools", func() bool { return settled(nodes, n, n-1) })
	for i, o := range nodes {
		if err := o.Health(); err != nil {
			t.Errorf("node %d unhealthy: %v", i, err)
		}
		if st := o.Status(); st.RoutingTableSize == 0 || !st.Ready {
			t.Errorf("node %d status %+v", i, st)
		}
	}
	checkSamples(t, nodes, all, "")

	victim := nodes[5]
	_ = victim.Close()
	_ = victim.h.Close()
	rest := slices.Delete(slices.Clone(nodes), 5, 6)
	eventually(t, 10*time.Second, "departed peer gone from every pool", func() bool { return forgotten(rest, victim.h.ID(), n-2) })
	checkSamples(t, rest, all, victim.h.ID())
	eventually(t, 15*time.Second, "estimates within ±1 of N-1", func() bool { return settled(rest, n-1, n-2) })
}

// tcpPatience bounds each wait of TestIntegrationTCP. On the real clock a
// deadline only stops a hung test: these waits usually end within a
// second or two, but on a machine busy with other tests they can take many
// times longer without anything being wrong. How fast the overlay reacts
// is asserted on a virtual clock by TestIntegrationMem.
const tcpPatience = 2 * time.Minute

// TestIntegrationTCP runs 12 real libp2p hosts over TCP loopback: they
// join through earlier nodes, estimate N, sample distinct live non-self
// peers, drop a closed node from samples and take it back when it rejoins
// with the same identity.
func TestIntegrationTCP(t *testing.T) {
	const n = 12
	const job = "itest"
	keys := seededKeys(t, 12, n)
	pick := rand.New(rand.NewPCG(12, 0))
	nodes := make([]*tnode, 0, n)
	defer func() {
		for _, nd := range nodes {
			if nd != nil {
				nd.stop()
			}
		}
	}()
	info := func(nd *tnode) peer.AddrInfo { return peer.AddrInfo{ID: nd.h.ID(), Addrs: nd.h.Addrs()} }
	for i := range n {
		var boot []peer.AddrInfo
		if i > 0 {
			boot = append(boot, info(nodes[0]), info(nodes[pick.IntN(i)]))
		}
		nodes = append(nodes, startNode(t, job, keys[i], boot...))
	}
	overlays := func() []*Overlay {
		var out []*Overlay
		for _, nd := range nodes {
			if nd != nil {
				out = append(out, nd.o)
			}
		}
		return out
	}
	all := make(map[peer.ID]bool)
	for _, nd := range nodes {
		all[nd.h.ID()] = true
		ctx, cancel := context.WithTimeout(context.Background(), tcpPatience)
		err := nd.o.WaitReady(ctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}

	// Everyone learns everyone: the estimate is (nearly) exact at this size.
	eventually(t, tcpPatience, "estimates within ±1 of N and full pools", func() bool { return settled(overlays(), n, n-1) })
	for i, o := range overlays() {
		if err := o.Health(); err != nil {
			t.Errorf("node %d unhealthy: %v", i, err)
		}
		if st := o.Status(); st.RoutingTableSize == 0 || !st.Ready {
			t.Errorf("node %d status %+v", i, st)
		}
	}
	checkSamples(t, overlays(), all, "")

	// A node leaves abruptly: nobody samples it any more and the estimates
	// drop to N-1.
	victim := nodes[5]
	victimID := victim.h.ID()
	victim.stop()
	nodes[5] = nil
	eventually(t, tcpPatience, "departed peer gone from every pool", func() bool { return forgotten(overlays(), victimID, n-2) })
	checkSamples(t, overlays(), all, victimID)
	eventually(t, tcpPatience, "estimates within ±1 of N-1", func() bool { return settled(overlays(), n-1, n-2) })

	// It rejoins with the same identity and is sampled again.
	rest := overlays()
	nodes[5] = startNode(t, job, victim.key, info(nodes[0]))
	eventually(t, tcpPatience, "rejoined peer back in every pool", func() bool {
		if !knows(rest, victimID) {
			return false
		}
		for _, o := range rest {
			if o.Status().Pool != n-1 {
				return false
			}
		}
		return true
	})
}

// TestJoinFails checks that New gives up with ErrJoin when no bootstrap
// peer can be reached, and leaves nothing running (the bubble fails on a
// goroutine still alive when the test ends).
func TestJoinFails(t *testing.T) { bubble(t, testJoinFails) }

func testJoinFails(t *testing.T) {
	net := memnet.New(0)
	defer func() { _ = net.Close() }()
	gone, err := net.NewHost(10, 20)
	if err != nil {
		t.Fatal(err)
	}
	_ = gone.Close()
	h, err := net.NewHost(10, 20)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = h.Close() }()
	o, err := New(context.Background(), h, fastConfig("join", peer.AddrInfo{ID: gone.ID()}))
	if !errors.Is(err, ErrJoin) {
		if o != nil {
			_ = o.Close()
		}
		t.Fatalf("New through a departed bootstrap peer: err = %v, want ErrJoin", err)
	}
}

// TestKeepJoining checks that with KeepJoining, New through a bootstrap
// peer it cannot reach succeeds: the overlay starts alone, says why
// (JoinError), keeps the bootstrap peer (its health reports the empty
// routing table), and joins through it once it can reach it.
func TestKeepJoining(t *testing.T) { bubble(t, testKeepJoining) }

func testKeepJoining(t *testing.T) {
	net := memnet.New(0)
	defer func() { _ = net.Close() }()
	bh, err := net.NewHost(10, 20)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = bh.Close() }()
	boot, err := New(context.Background(), bh, fastConfig("keep"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = boot.Close() }()
	h, err := net.NewHost(10, 20)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = h.Close() }()
	net.Partition(func(p peer.ID) int {
		if p == bh.ID() {
			return 1
		}
		return 0
	})
	cfg := fastConfig("keep", peer.AddrInfo{ID: bh.ID(), Addrs: bh.Addrs()})
	cfg.KeepJoining = true
	o, err := New(context.Background(), h, cfg)
	if err != nil {
		t.Fatalf("New with KeepJoining through an unreachable peer: %v", err)
	}
	defer func() { _ = o.Close() }()
	if !errors.Is(o.JoinError(), ErrJoin) {
		t.Errorf("JoinError() = %v, want ErrJoin", o.JoinError())
	}
	if err := o.Health(); err == nil || !strings.Contains(err.Error(), "routing table empty") {
		t.Errorf("Health() = %v, want the empty routing table of an overlay with bootstrap peers", err)
	}
	net.Heal()
	eventually(t, time.Minute, "the overlay to join through its bootstrap peer once reachable", func() bool {
		return slices.Contains(o.DHT().RoutingTable().ListPeers(), bh.ID())
	})
}
