package overlay

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/net/connmgr"

	"github.com/pspnode/pspnode/internal/memnet"
)

// memOverlays starts n overlays on a fresh in-memory network (hosts with
// connection-manager watermarks low and high), each joining through the
// first node and the one before it, with fastConfig(job) adjusted by tune
// (which may be nil) for node i. Everything is closed when the test ends.
func memOverlays(t *testing.T, n int, job string, low, high int, tune func(i int, cfg *Config)) (*memnet.Net, []*Overlay) {
	t.Helper()
	net := memnet.New(0)
	t.Cleanup(func() { _ = net.Close() })
	var nodes []*Overlay
	for i := range n {
		h, err := net.NewHost(low, high)
		if err != nil {
			t.Fatal(err)
		}
		cfg := fastConfig(job)
		if i > 0 {
			cfg.BootstrapPeers = []peer.AddrInfo{{ID: nodes[0].h.ID()}}
			if i > 1 {
				cfg.BootstrapPeers = append(cfg.BootstrapPeers, peer.AddrInfo{ID: nodes[i-1].h.ID()})
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
		t.Cleanup(func() { _ = o.Close(); _ = h.Close() })
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
	if key == nil {
		var err error
		key, _, err = crypto.GenerateEd25519Key(nil)
		if err != nil {
			t.Fatal(err)
		}
	}
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

// eventually polls cond every 100 ms until it holds or d passes.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestIntegrationTCP runs 12 real libp2p hosts over TCP loopback: they
// join through earlier nodes, estimate N, sample distinct live non-self
// peers, drop a closed node from samples and take it back when it rejoins.
func TestIntegrationTCP(t *testing.T) {
	const n = 12
	const job = "itest"
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
			boot = append(boot, info(nodes[0]), info(nodes[rand.IntN(i)]))
		}
		nodes = append(nodes, startNode(t, job, nil, boot...))
	}
	all := make(map[peer.ID]bool)
	for _, nd := range nodes {
		all[nd.h.ID()] = true
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		if err := nd.o.WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
		cancel()
	}

	// Everyone learns everyone: the estimate is (nearly) exact at this size.
	eventually(t, 25*time.Second, "estimates within ±1 of N and full pools", func() bool {
		for _, nd := range nodes {
			est, _, err := nd.o.Estimate()
			if err != nil || math.Abs(est-n) > 1 || nd.o.Status().Pool < n-1 {
				return false
			}
		}
		return true
	})
	for i, nd := range nodes {
		if err := nd.o.Health(); err != nil {
			t.Errorf("node %d unhealthy: %v", i, err)
		}
		st := nd.o.Status()
		if st.RoutingTableSize == 0 || !st.Ready {
			t.Errorf("node %d status %+v", i, st)
		}
	}

	checkSamples := func(live []*tnode, banned peer.ID) {
		t.Helper()
		for _, nd := range live {
			for range 20 {
				s, err := nd.o.Sample(context.Background(), 5)
				if err != nil {
					t.Fatalf("sample: %v", err)
				}
				seen := make(map[peer.ID]bool)
				for _, p := range s {
					switch {
					case p == nd.h.ID():
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
	checkSamples(nodes, "")

	// A node leaves abruptly: within a few seconds nobody samples it and
	// the estimates drop to N-1.
	victim := nodes[5]
	victimID := victim.h.ID()
	victim.stop()
	nodes[5] = nil
	rest := append(append([]*tnode{}, nodes[:5]...), nodes[6:]...)
	eventually(t, 10*time.Second, "departed peer gone from every pool", func() bool {
		for _, nd := range rest {
			for _, p := range nd.o.Peers() {
				if p == victimID {
					return false
				}
			}
			if nd.o.Status().Pool != n-2 {
				return false
			}
		}
		return true
	})
	checkSamples(rest, victimID)
	eventually(t, 15*time.Second, "estimates within ±1 of N-1", func() bool {
		for _, nd := range rest {
			est, _, err := nd.o.Estimate()
			if err != nil || math.Abs(est-(n-1)) > 1 {
				return false
			}
		}
		return true
	})

	// It rejoins with the same identity and is sampled again.
	nodes[5] = startNode(t, job, victim.key, info(nodes[0]))
	eventually(t, 15*time.Second, "rejoined peer back in every pool", func() bool {
		for _, nd := range rest {
			found := false
			for _, p := range nd.o.Peers() {
				found = found || p == victimID
			}
			if !found || nd.o.Status().Pool != n-1 {
				return false
			}
		}
		return true
	})
}
