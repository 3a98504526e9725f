package gossip

import (
	"context"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	mocknet "github.com/libp2p/go-libp2p/p2p/net/mock"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pspnode/pspnode/internal/memnet"
	"github.com/pspnode/pspnode/internal/vclock"
)

// mockHosts returns n linked mocknet hosts (not yet connected).
func mockHosts(t testing.TB, n int) (mocknet.Mocknet, []host.Host) {
	t.Helper()
	mn := mocknet.New()
	t.Cleanup(func() { _ = mn.Close() })
	hosts := make([]host.Host, n)
	for i := range hosts {
		h, err := mn.GenPeer()
		if err != nil {
			t.Fatal(err)
		}
		hosts[i] = h
	}
	if err := mn.LinkAll(); err != nil {
		t.Fatal(err)
	}
	return mn, hosts
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitMeshes waits until each node's mesh has a peer (Gossip.WaitMesh).
func waitMeshes(t *testing.T, ctx context.Context, gs ...*Gossip) {
	t.Helper()
	for i, g := range gs {
		if !g.WaitMesh(ctx) {
			t.Fatalf("node %d: no mesh peer within two heartbeats", i)
		}
	}
}

type recorder struct {
	mu  sync.Mutex
	got []Update
}

func (r *recorder) handle(u Update) {
	r.mu.Lock()
	r.got = append(r.got, u)
	r.mu.Unlock()
}

func (r *recorder) updates() []Update {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got)
}

func TestGossipNetwork(t *testing.T) {
	const honest, n = 4, 10
	mn, hosts := mockHosts(t, honest+1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	gs := make([]*Gossip, honest)
	recs := make([]*recorder, honest)
	regs := make([]*prometheus.Registry, honest)
	for i := range gs {
		recs[i] = &recorder{}
		regs[i] = prometheus.NewRegistry()
		cfg := DefaultConfig()
		cfg.Job = "test"
		cfg.ParamCount = n
		cfg.ModelID = 42
		cfg.Handler = recs[i].handle
		cfg.Registerer = regs[i]
		g, err := New(ctx, hosts[i], cfg)
		if err != nil {
			t.Fatal(err)
		}
		gs[i] = g
		defer func() {
			if err := g.Close(); err != nil {
				t.Errorf("close: %v", err)
			}
		}()
	}
	// The hostile node runs a plain GossipSub router without validators (it
	// signs correctly: the attack is in the payload).
	bad := hosts[honest]
	badPS, err := pubsub.NewGossipSub(ctx, bad, pubsub.WithFloodPublish(true))
	if err != nil {
		t.Fatal(err)
	}
	badTopic, err := badPS.Join(TopicName("test"))
	if err != nil {
		t.Fatal(err)
	}
	badSub, err := badTopic.Subscribe()
	if err != nil {
		t.Fatal(err)
	}
	defer badSub.Cancel()

	if err := mn.ConnectAllButSelf(); err != nil {
		t.Fatal(err)
	}
	for i, g := range gs {
		waitFor(t, "topic peers", func() bool { return len(g.Peers()) == honest })
		_ = i
	}
	waitFor(t, "hostile topic peers", func() bool { return len(badTopic.ListPeers()) == honest })
	waitMeshes(t, ctx, gs[:]...)

	// 1. An honest update reaches every other honest node, exactly.
	delta := []float64{0.5, -0.25, 0, 1, 2, -3, 0.125, float64(float32(1e-3)), float64(float32(0.1)), 7}
	if err := gs[0].Publish(ctx, 1, f32s(delta)); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < honest; i++ {
		waitFor(t, "delivery", func() bool { return len(recs[i].updates()) == 1 })
		u := recs[i].updates()[0]
		if u.Sender != hosts[0].ID() || u.Step != 1 || u.ModelID != 42 {
			t.Fatalf("node %d got header %+v", i, u)
		}
		if got := dense64(&u); !slices.Equal(got, delta) {
			t.Fatalf("node %d got %v, want %v", i, got, delta)
		}
	}

	// 2. Hostile payloads: NaN, a forged sender, a wrong length.
	publishRaw := func(u *Update) {
		t.Helper()
		b, err := EncodeUpdate(nil, u)
		if err != nil {
			t.Fatal(err)
		}
		if err := badTopic.Publish(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	vals := make([]float32, n)
	vals[3] = float32(math.NaN())
	publishRaw(&Update{Sender: bad.ID(), Step: 1, ModelID: 42, ParamCount: n, Encoding: EncodingDense32, Values: vals})
	publishRaw(&Update{Sender: hosts[1].ID(), Step: 1, ModelID: 42, ParamCount: n, Encoding: EncodingDense32, Values: make([]float32, n)})
	publishRaw(&Update{Sender: bad.ID(), Step: 1, ModelID: 42, ParamCount: n + 1, Encoding: EncodingDense32, Values: make([]float32, n+1)})
	for i, g := range gs {
		waitFor(t, "rejections", func() bool {
			s := g.Stats()
			return s.Rejected[ReasonNonFinite] == 1 && s.Rejected[ReasonSenderMismatch] == 1 && s.Rejected[ReasonWrongLength] == 1
		})
		if c := gathered(t, regs[i], "psp_gossip_rejected_updates_total", string(ReasonNonFinite)); c != 1 {
			t.Errorf("node %d: prometheus non_finite = %v", i, c)
		}
	}

	// 3. A later honest update still flows; nothing hostile was delivered,
	// and nobody got its own update back.
	if err := gs[1].Publish(ctx, 2, f32s(delta)); err != nil {
		t.Fatal(err)
	}
	for i := range gs {
		want := 2
		if i == 0 || i == 1 {
			want = 1
		}
		waitFor(t, "second delivery", func() bool { return len(recs[i].updates()) == want })
		for _, u := range recs[i].updates() {
			if u.Sender == bad.ID() || u.Sender == hosts[i].ID() {
				t.Fatalf("node %d was delivered an update from %s", i, u.Sender)
			}
			for _, v := range u.Values {
				if v != v {
					t.Fatalf("node %d was delivered a NaN", i)
				}
			}
		}
	}
	s0 := gs[0].Stats()
	if s0.Sent != 1 || s0.LastSentBytes != MaxEncodedSize(n)-MaxPeerIDLen+len(hosts[0].ID()) {
		t.Errorf("sender stats %+v", s0)
	}
	if s := gs[2].Stats(); s.Received != 2 || s.ReceivedBytes == 0 {
		t.Errorf("receiver stats %+v", s)
	}
}

func TestGossipTopKError(t *testing.T) {
	// Top-k over the network: the receiver gets exactly the sparse update
	// and, summed over steps, the sender's whole delta.
	const n = 200
	mn, hosts := mockHosts(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rec := &recorder{}
	var gs [2]*Gossip
	for i := range gs {
		cfg := DefaultConfig()
		cfg.Job = "topk"
		cfg.ParamCount = n
		cfg.Encoding = EncodingTopK32
		cfg.TopKFraction = 0.1
		if i == 1 {
			cfg.Handler = rec.handle
		}
		g, err := New(ctx, hosts[i], cfg)
		if err != nil {
			t.Fatal(err)
		}
		gs[i] = g
		defer g.Close()
	}
	if err := mn.ConnectAllButSelf(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "topic peers", func() bool { return len(gs[0].Peers()) == 1 && len(gs[1].Peers()) == 1 })
	waitMeshes(t, ctx, gs[:]...)
	delta := make([]float64, n)
	for i := range delta {
		delta[i] = float64(float32(math.Sin(float64(i))))
	}
	var extra atomic.Int64
	unsubscribe := gs[1].Subscribe(func(Update) { extra.Add(1) })
	zero := make([]float64, n)
	const steps = 10
	for s := int64(0); s < steps; s++ {
		d := zero
		if s == 0 {
			d = delta
		}
		if err := gs[0].Publish(ctx, s, f32s(d)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "deliveries", func() bool { return len(rec.updates()) == steps })
	if extra.Load() != steps {
		t.Fatalf("second handler got %d updates, want %d", extra.Load(), steps)
	}
	unsubscribe()
	if err := gs[0].Publish(ctx, steps, f32s(zero)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "last delivery", func() bool { return len(rec.updates()) == steps+1 })
	if extra.Load() != steps {
		t.Fatal("handler called after unsubscribe")
	}
	sum := make([]float64, n)
	for _, u := range rec.updates()[:steps] {
		if u.Encoding != EncodingTopK32 || len(u.Indices) > 20 {
			t.Fatalf("update %v with %d entries", u.Encoding, len(u.Indices))
		}
		add64(sum, &u)
	}
	for i := range sum {
		if math.Abs(sum[i]-delta[i]) > 1e-7 {
			t.Fatalf("entry %d: received sum %g, delta %g", i, sum[i], delta[i])
		}
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	_, hosts := mockHosts(t, 1)
	for name, mut := range map[string]func(*Config){
		"no params":   func(c *Config) { c.ParamCount = 0 },
		"bad job":     func(c *Config) { c.Job = "a/b" },
		"encoding":    func(c *Config) { c.Encoding = 0 },
		"topk frac":   func(c *Config) { c.Encoding, c.TopKFraction = EncodingTopK16, 0 },
		"max abs":     func(c *Config) { c.MaxAbsValue = math.NaN() },
		"message cap": func(c *Config) { c.MaxMessageSize = -1 },
	} {
		cfg := DefaultConfig()
		cfg.ParamCount = 10
		mut(&cfg)
		if g, err := New(context.Background(), hosts[0], cfg); err == nil {
			g.Close()
			t.Errorf("%s: New succeeded", name)
		}
	}
}

func TestPublishChecks(t *testing.T) {
	_, hosts := mockHosts(t, 1)
	cfg := DefaultConfig()
	cfg.ParamCount = 3
	g, err := New(context.Background(), hosts[0], cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for name, d := range map[string][]float32{
		"length": {1, 2},
		"NaN":    {1, float32(math.NaN()), 0},
		"Inf":    {1, 0, float32(math.Inf(1))},
	} {
		if err := g.Publish(ctx, 1, d); err == nil {
			t.Errorf("%s: Publish succeeded", name)
		}
	}
	if err := g.Publish(ctx, -1, []float32{1, 2, 3}); err == nil {
		t.Error("negative step published")
	}
	if err := g.Publish(ctx, 5, []float32{1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	if g.LocalStep() != 5 {
		t.Errorf("local step %d after publishing step 5", g.LocalStep())
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	if err := g.Close(); err != nil {
		t.Fatal("second close:", err)
	}
	if err := g.Publish(ctx, 6, []float32{1, 2, 3}); err != ErrClosed {
		t.Fatalf("publish after close: %v", err)
	}
	// The host can host a new Gossip after Close.
	g2, err := New(context.Background(), hosts[0], cfg)
	if err != nil {
		t.Fatal(err)
	}
	g2.Close()
}

// gathered returns the value of a counter (with reason label, if given).
func gathered(t *testing.T, reg *prometheus.Registry, name, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			match := reason == ""
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					match = true
				}
			}
			if match {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("metric %s{reason=%q} not found", name, reason)
	return 0
}

// A node without a peer waits two heartbeats for its mesh, then goes on;
// WaitMesh returns at once when the mesh has a peer, and when flood
// publishing makes the mesh irrelevant to a node's own updates.
func TestWaitMesh(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		mn := memnet.New(0)
		t.Cleanup(func() { _ = mn.Close() })
		newG := func(flood bool) *Gossip {
			h, err := mn.NewHost(10, 20)
			if err != nil {
				t.Fatal(err)
			}
			cfg := DefaultConfig()
			cfg.ParamCount = 3
			cfg.FloodPublish = flood
			g, err := New(t.Context(), h, cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = g.Close() })
			return g
		}
		lone := newG(false)
		t0 := time.Now()
		if lone.WaitMesh(t.Context()) {
			t.Error("a lone node found a mesh peer")
		}
		if d, want := time.Since(t0), 2*lone.cfg.GossipSub.HeartbeatInterval; d != want {
			t.Errorf("a lone node waited %v, want %v", d, want)
		}
		if !newG(true).WaitMesh(t.Context()) {
			t.Error("with flood publishing WaitMesh did not return true")
		}
		other := newG(false)
		if err := lone.h.Connect(t.Context(), peer.AddrInfo{ID: other.h.ID(), Addrs: other.h.Addrs()}); err != nil {
			t.Fatal(err)
		}
		if !other.WaitMesh(t.Context()) {
			t.Fatal("no mesh peer within two heartbeats of connecting")
		}
		if !lone.WaitMesh(t.Context()) {
			t.Error("the first node's mesh stayed empty")
		}
	})
}
