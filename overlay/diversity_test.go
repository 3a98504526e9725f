package overlay

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p-kbucket/peerdiversity"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/pspnode/pspnode/internal/memnet"
)

func TestAddrKey(t *testing.T) {
	for _, tc := range []struct{ addr, want string }{
		{"/ip4/1.2.3.4/tcp/4001", "1.2.3.4"},
		{"/ip4/1.2.3.4/udp/4001/quic-v1", "1.2.3.4"},
		{"/ip6/2001:db8:1:2:3:4:5:6/tcp/4001", "2001:db8:1:2::/64"},
		{"/ip6/2001:db8:1:2:ffff::1/tcp/4001", "2001:db8:1:2::/64"},
		{"/ip4/127.0.0.1/tcp/4001", ""}, // loopback: exempt
		{"/ip6/::1/tcp/4001", ""},
		{"/dns4/example.com/tcp/4001", ""},
	} {
		if got := addrKey(ma.StringCast(tc.addr)); got != tc.want {
			t.Errorf("addrKey(%s) = %q, want %q", tc.addr, got, tc.want)
		}
	}
}

// TestSamplePerAddress draws from 180 peers with addresses of their own
// and 20 behind one address: with PerAddress 1 the 20 together are drawn
// about as often as one peer (1/181 of the draws), and never two in one
// sample; without the limit as often as 20 (1/10).
func TestSamplePerAddress(t *testing.T) {
	for _, tc := range []struct {
		perAddress int
		want       float64
	}{{1, 1.0 / 181}, {0, 20.0 / 200}} {
		cfg := DefaultConfig()
		cfg.Seed = 3
		cfg.PerAddress = tc.perAddress
		o, sybil := sharedAddrOverlay(t, cfg, 3, 200, 20, "203.0.113.7")
		verifyPool(o)
		const draws = 200_000
		hits := 0
		for range draws / 10 {
			s, err := o.Sample(context.Background(), 10)
			if err != nil {
				t.Fatal(err)
			}
			in := countIn(s, sybil)
			if tc.perAddress == 1 && in > 1 {
				t.Fatalf("%d peers of one address in a sample, want at most 1", in)
			}
			hits += in
		}
		share := float64(hits) / draws
		t.Logf("PerAddress %d: shared address drawn %.4f of the time (want %.4f)", tc.perAddress, share, tc.want)
		if math.Abs(share-tc.want) > 0.15*tc.want {
			t.Errorf("PerAddress %d: shared address drawn %.4f of the time, want %.4f ± 15 %%", tc.perAddress, share, tc.want)
		}
		// The weighted full pass (when drawable peers are few) keeps the
		// weights too: ask for all but a few of the drawable peers.
		if tc.perAddress == 1 {
			for range 200 {
				s, err := o.Sample(context.Background(), 150)
				if err != nil {
					t.Fatal(err)
				}
				in := countIn(s, sybil)
				if in > 1 {
					t.Fatalf("weighted full pass: %d peers of one address in a sample of 150, want at most 1", in)
				}
			}
			// A sample that needs more of them than the cap allows
			// still gets them: 181 drawable addresses, 190 peers asked.
			s, err := o.Sample(context.Background(), 190)
			if err != nil || len(s) != 190 {
				t.Errorf("a sample of 190 of 200: %d peers, %v", len(s), err)
			}
		}
	}
	// Counts follow deaths and revivals.
	o := bareOverlay(t, DefaultConfig())
	ps := synthPeers(t, 4, 3)
	now := time.Now()
	for _, p := range ps {
		o.setAddrLocked(o.touchLocked(p, true, now), "203.0.113.9")
	}
	if got := o.addrCount["203.0.113.9"]; got != 3 {
		t.Fatalf("addrCount %d, want 3", got)
	}
	o.markDeadLocked(o.members[ps[0]], now, "test")
	if got := o.weightLocked(o.members[ps[1]]); got != 0.5 {
		t.Errorf("weight %v after a death, want 1/2", got)
	}
	o.touchLocked(ps[0], true, now)
	if got := o.weightLocked(o.members[ps[1]]); math.Abs(got-1.0/3) > 1e-9 {
		t.Errorf("weight %v after the revival, want 1/3", got)
	}
	// Below the cap again, every member weighs 1 (and no lookup is made).
	for _, p := range ps[:2] {
		o.markDeadLocked(o.members[p], now, "test")
	}
	if got := o.weightLocked(o.members[ps[2]]); got != 1 || o.crowded != 0 {
		t.Errorf("weight %v, %d crowded addresses with one peer left, want 1 and 0", got, o.crowded)
	}
}

// crowded, the number of address groups above PerAddress that lets
// weightLocked skip its lookup, follows every count.
func TestCrowdedFollowsCounts(t *testing.T) {
	o := bareOverlay(t, DefaultConfig())
	rng := rand.New(rand.NewPCG(1, 2))
	keys := []string{"a", "b", "c", "d"}
	for i := range 2000 {
		k := keys[rng.IntN(len(keys))]
		d := 1
		if o.addrCount[k] > 0 && rng.IntN(2) == 0 {
			d = -1
		}
		o.countAddrLocked(k, d)
		want := 0
		for _, n := range o.addrCount {
			if n > o.cfg.PerAddress {
				want++
			}
		}
		if o.crowded != want {
			t.Fatalf("after %d changes: crowded %d, want %d (counts %v)", i+1, o.crowded, want, o.addrCount)
		}
	}
}

// The routing table's filter admits one peer of a shared address per
// bucket and two in the table, counts each peer once, and frees its place
// when it leaves; peers with addresses of their own are not limited.
func TestRTAddrFilter(t *testing.T) {
	n := memnet.NewNet(memnet.Config{Seed: 5})
	defer n.Close()
	a, err := n.NewHost(16, 32)
	if err != nil {
		t.Fatal(err)
	}
	shared := n.NewIP()
	var sy []peer.ID
	for range 3 {
		h, err := n.NewHostWith(memnet.HostOptions{Low: 16, High: 32, IP: shared})
		if err != nil {
			t.Fatal(err)
		}
		sy = append(sy, h.ID())
	}
	own, err := n.NewHost(16, 32)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, p := range append(slices.Clone(sy), own.ID()) {
		if err := a.Connect(ctx, peer.AddrInfo{ID: p}); err != nil {
			t.Fatal(err)
		}
	}
	f := newRTAddrFilter(a, 1)
	g := func(p peer.ID, cpl int) peerdiversity.PeerGroupInfo {
		return peerdiversity.PeerGroupInfo{Id: p, Cpl: cpl}
	}
	type check struct {
		name string
		ok   bool
	}
	steps := []check{{"first of the address", f.Allow(g(sy[0], 3))}}
	f.Increment(g(sy[0], 3))
	f.Increment(g(sy[0], 3)) // once per address of the peer: counted once
	steps = append(steps,
		check{"second in the same bucket", !f.Allow(g(sy[1], 3))},
		check{"second in another bucket", f.Allow(g(sy[1], 4))})
	f.Increment(g(sy[1], 4))
	steps = append(steps,
		check{"third in the table", !f.Allow(g(sy[2], 5))},
		check{"a peer of its own address", f.Allow(g(own.ID(), 3))})
	f.Decrement(g(sy[0], 3))
	steps = append(steps, check{"third after one left", f.Allow(g(sy[2], 5))})
	for _, s := range steps {
		if !s.ok {
			t.Errorf("%s: wrong decision", s.name)
		}
	}
}

// TestSampleUpTo asks for more peers than there are: every peer of an
// address of its own, and at most PerAddress of a shared address, where
// Sample short of peers fills up with them (a joiner asking every known
// peer must not let one host's identities outnumber the rest).
func TestSampleUpTo(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Seed = 5
	o, sybil := sharedAddrOverlay(t, cfg, 6, 30, 20, "203.0.113.8")
	for _, tc := range []struct{ k, want, wantSybil int }{
		{64, 11, 1}, // all 10 of their own, one of the 20
		{5, 5, -1},  // fewer than there are: any 5, at most one of the 20
		{0, 0, 0},
	} {
		s, err := o.SampleUpTo(context.Background(), tc.k)
		if err != nil {
			t.Fatal(err)
		}
		in := countIn(s, sybil)
		if len(s) != tc.want || in > 1 || (tc.wantSybil >= 0 && in != tc.wantSybil) {
			t.Errorf("SampleUpTo(%d): %d peers, %d of the shared address; want %d, %d", tc.k, len(s), in, tc.want, tc.wantSybil)
		}
	}
	if s, err := o.Sample(context.Background(), 30); err != nil || len(s) != 30 {
		t.Errorf("Sample(30) of 30: %d, %v (it fills up past the cap)", len(s), err)
	}
}

// sharedAddrOverlay is an overlay of n live synthetic peers (seed), the
// first shared of them behind addr, the others at addresses of their own;
// it returns the overlay and the set of the shared ones.
func sharedAddrOverlay(t *testing.T, cfg Config, seed uint64, n, shared int, addr string) (*Overlay, map[peer.ID]bool) {
	t.Helper()
	o := bareOverlay(t, cfg)
	now := time.Now()
	in := make(map[peer.ID]bool)
	for i, p := range synthPeers(t, seed, n) {
		m := o.touchLocked(p, true, now)
		if i < shared {
			o.setAddrLocked(m, addr)
			in[p] = true
		} else {
			o.setAddrLocked(m, fmt.Sprintf("198.51.100.%d", i))
		}
	}
	return o, in
}

// countIn counts the peers of s in set.
func countIn(s []peer.ID, set map[peer.ID]bool) int {
	n := 0
	for _, p := range s {
		if set[p] {
			n++
		}
	}
	return n
}
