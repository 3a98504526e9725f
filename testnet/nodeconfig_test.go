package testnet

import (
	"log/slog"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/pspnode/pspnode/gossip"
	"github.com/pspnode/pspnode/node"
	"github.com/pspnode/pspnode/node/exchange"
	"github.com/pspnode/pspnode/node/netsetup"
	"github.com/pspnode/pspnode/psp"
	"github.com/pspnode/pspnode/testnet/plan"
)

// What the testnet sets in a node's configuration, field by field, for
// its settings (tn.cfg) and whether the node joins a running job. Every
// field not named here keeps node.DefaultLocalConfig's value.
var nodeConfigRows = []struct {
	field string
	got   func(node.Config) any
	want  func(tn *testnet, joining bool) any
}{
	{"Job", func(c node.Config) any { return c.Job }, func(*testnet, bool) any { return "testnet" }},
	{"Barrier", func(c node.Config) any { return c.Barrier }, func(tn *testnet, _ bool) any { return tn.cfg.Barrier }},
	{"EvalEvery", func(c node.Config) any { return c.EvalEvery }, func(*testnet, bool) any { return 0 }},
	{"JoinFetch", func(c node.Config) any { return c.JoinFetch }, func(_ *testnet, joining bool) any { return joining }},
	{"Genesis", func(c node.Config) any { return c.Genesis }, func(tn *testnet, _ bool) any { return plan.Genesis(tn.cfg.Seed) }},
	{"Check.QueryTimeout", func(c node.Config) any { return c.Check.QueryTimeout }, func(*testnet, bool) any { return 2 * time.Second }},
	{"NAT", func(c node.Config) any { return c.NAT }, func(*testnet, bool) any { return netsetup.NATConfig{} }},
	{"Check.PollShare", func(c node.Config) any { return c.Check.PollShare }, func(tn *testnet, _ bool) any { return tn.cfg.PollShare }},
	{"Exchange.Spec", func(c node.Config) any { return c.Exchange.Spec }, func(tn *testnet, _ bool) any { return tn.cfg.Exchange }},
	{"Exchange.NormBound", func(c node.Config) any { return c.Exchange.NormBound }, func(tn *testnet, _ bool) any {
		switch nb := tn.cfg.NormBound; {
		case nb > 0:
			return nb
		case nb < 0:
			return 0.0
		}
		return node.DefaultConfig().Exchange.NormBound
	}},
	{"Screen", func(c node.Config) any { return c.Screen }, func(tn *testnet, _ bool) any {
		if tn.cfg.NoScreen {
			return psp.ScreenConfig{}
		}
		return node.DefaultConfig().Screen
	}},
	{"Limits.ConnLow", func(c node.Config) any { return c.Limits.ConnLow }, func(tn *testnet, _ bool) any { low, _, _ := tn.cfg.Limits(); return low }},
	{"Limits.ConnHigh", func(c node.Config) any { return c.Limits.ConnHigh }, func(tn *testnet, _ bool) any { _, high, _ := tn.cfg.Limits(); return high }},
	{"Limits.StepStreams", func(c node.Config) any { return c.Limits.StepStreams }, func(tn *testnet, _ bool) any {
		if tn.cfg.StepStreams > 0 {
			return tn.cfg.StepStreams
		}
		_, high, _ := tn.cfg.Limits()
		return max(64, min(high, 256))
	}},
	{"Listen", func(c node.Config) any { return c.Listen }, func(*testnet, bool) any { return []string{"/ip4/127.0.0.1/tcp/0"} }},
	{"Gossip.Logger", func(c node.Config) any { return c.Gossip.Logger }, func(tn *testnet, _ bool) any { return tn.log }},
	{"Gossip.Encoding", func(c node.Config) any { return c.Gossip.Encoding }, func(tn *testnet, _ bool) any {
		enc, err := gossip.ParseEncoding(tn.cfg.Encoding)
		if err != nil {
			panic(err)
		}
		return enc
	}},
	{"Gossip.PeerScoring", func(c node.Config) any { return c.Gossip.PeerScoring }, func(*testnet, bool) any { return true }},
	{"Overlay.Logger", func(c node.Config) any { return c.Overlay.Logger }, func(tn *testnet, _ bool) any { return tn.log }},
	{"Overlay.PoolSize", func(c node.Config) any { return c.Overlay.PoolSize }, func(tn *testnet, _ bool) any { _, _, pool := tn.cfg.Limits(); return pool }},
	{"Overlay.PerAddress", func(c node.Config) any { return c.Overlay.PerAddress }, func(tn *testnet, _ bool) any {
		if tn.cfg.NoSybilDefence {
			return 0
		}
		return node.DefaultConfig().Overlay.PerAddress
	}},
	{"Check (the rest)", func(c node.Config) any {
		x := c.Check
		x.QueryTimeout, x.PollShare = 0, 0
		return x
	}, func(*testnet, bool) any {
		x := node.DefaultConfig().Check
		x.QueryTimeout, x.PollShare = 0, 0
		return x
	}},
	{"Limits (the rest)", func(c node.Config) any {
		x := c.Limits
		x.ConnLow, x.ConnHigh, x.StepStreams = 0, 0, 0
		return x
	}, func(*testnet, bool) any {
		x := node.DefaultConfig().Limits
		x.ConnLow, x.ConnHigh, x.StepStreams = 0, 0, 0
		return x
	}},
	{"Exchange (the rest)", func(c node.Config) any {
		x := c.Exchange
		x.Spec, x.NormBound = exchange.Spec{}, 0
		return x
	}, func(*testnet, bool) any {
		x := node.DefaultConfig().Exchange
		x.Spec, x.NormBound = exchange.Spec{}, 0
		return x
	}},
	{"Gossip (the rest)", func(c node.Config) any {
		g := c.Gossip
		g.Logger, g.Encoding = nil, 0
		return g
	}, func(*testnet, bool) any {
		g := node.DefaultConfig().Gossip
		g.Logger, g.Encoding = nil, 0
		return g
	}},
	// The overlay's periods stretch past overlay.SharedMachineNodes.
	{"Overlay (the rest)", func(c node.Config) any {
		o := c.Overlay
		o.Logger, o.PoolSize, o.PerAddress = nil, 0, 0
		return o
	}, func(tn *testnet, _ bool) any {
		o := node.DefaultConfig().Overlay.ForSharedMachine(tn.cfg.Nodes)
		o.Logger, o.PoolSize, o.PerAddress = nil, 0, 0
		return o
	}},
}

// The testnet's nodes are node.DefaultLocalConfig with the testnet's
// settings (nodeConfigRows), whatever those settings: every field the
// table names has its value, and no other moves. (On the mem transport
// the node is given its host and listens on nothing itself, so Listen is
// not held there.)
func TestNodeConfig(t *testing.T) {
	named := map[string]bool{}
	for _, r := range nodeConfigRows {
		named[strings.SplitN(r.field, ".", 2)[0]] = true
	}
	for _, tc := range []struct {
		name string
		mod  func(*plan.Config)
	}{
		{"defaults", func(*plan.Config) {}},
		{"tcp", func(c *plan.Config) { c.Transport = "tcp" }},
		{"1000 nodes", func(c *plan.Config) { c.Nodes = 1000 }},
		{"150 nodes, pool set", func(c *plan.Config) { c.Nodes, c.PoolSize, c.ConnLow, c.ConnHigh = 150, 40, 10, 20 }},
		{"pbsp:80, above the default pool", func(c *plan.Config) { c.Barrier = psp.MustParse("pbsp:80") }},
		{"no screen, no sybil defence", func(c *plan.Config) { c.NoScreen, c.NoSybilDefence = true, true }},
		{"norm bound set", func(c *plan.Config) { c.NormBound = 2.5 }},
		{"norm bound off", func(c *plan.Config) { c.NormBound = -1 }},
		{"top-k, poll share", func(c *plan.Config) { c.Encoding, c.PollShare, c.Exchange = "topk16", 0.25, exchange.Spec{} }},
		{"epidemic", func(c *plan.Config) { c.Exchange = exchange.Spec{Kind: exchange.Epidemic, S: 3} }},
		{"seed", func(c *plan.Config) { c.Seed = 42 }},
		{"step streams set", func(c *plan.Config) { c.StepStreams = 8 }},
		{"1000 nodes, step streams set", func(c *plan.Config) { c.Nodes, c.StepStreams = 1000, 100 }},
	} {
		for _, joining := range []bool{false, true} {
			c := plan.DefaultConfig()
			tc.mod(&c)
			tn := &testnet{cfg: c, log: slog.New(slog.DiscardHandler)}
			got, err := tn.nodeConfig(joining)
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			for _, r := range nodeConfigRows {
				if r.field == "Listen" && c.Transport != "tcp" {
					continue
				}
				if g, w := r.got(got), r.want(tn, joining); !reflect.DeepEqual(g, w) {
					t.Errorf("%s, joining %v: %s = %+v, want %+v", tc.name, joining, r.field, g, w)
				}
			}
			gv, dv := reflect.ValueOf(got), reflect.ValueOf(node.DefaultLocalConfig())
			for i := range gv.NumField() {
				f := gv.Type().Field(i)
				if !f.IsExported() || named[f.Name] {
					continue
				}
				if !reflect.DeepEqual(gv.Field(i).Interface(), dv.Field(i).Interface()) {
					t.Errorf("%s, joining %v: %s = %+v, not DefaultLocalConfig's %+v", tc.name, joining, f.Name, gv.Field(i).Interface(), dv.Field(i).Interface())
				}
			}
			if err := got.Validate(); err != nil {
				t.Errorf("%s, joining %v: %v", tc.name, joining, err)
			}
		}
	}
}

// Up to 500 nodes every peer fits under the high watermark, so the
// connection manager never trims connections that sampling would dial
// again; above, the watermarks bound memory. A node keeps an idle step
// stream to as many peers as it holds connections to, up to half its
// inbound stream cap: up to 257 nodes, to every peer.
func TestLimitsByNodes(t *testing.T) {
	for _, tc := range []struct {
		nodes     int
		transport string
		trims     bool
	}{
		{50, "mem", false}, {100, "mem", false}, {101, "mem", false}, {200, "mem", false},
		{500, "mem", false}, {501, "mem", true}, {1000, "mem", true}, {100, "tcp", true},
	} {
		c := plan.DefaultConfig()
		c.Nodes, c.Transport = tc.nodes, tc.transport
		low, high, pool := c.Limits()
		if trims := high < tc.nodes-1; trims != tc.trims || low > high || pool < c.Barrier.Beta {
			t.Errorf("%d nodes over %s: watermarks %d/%d, pool %d; want trimming %v", tc.nodes, tc.transport, low, high, pool, tc.trims)
		}
		tn := &testnet{cfg: c, log: slog.New(slog.DiscardHandler)}
		nc, err := tn.nodeConfig(false)
		if err != nil {
			t.Fatal(err)
		}
		want := min(high, nc.Limits.MaxInboundStreams/2)
		if tc.nodes <= 257 && !tc.trims {
			want = tc.nodes - 1 // at least: every peer
		}
		if nc.Limits.StepStreams < want || nc.Limits.StepStreams < node.DefaultConfig().Limits.StepStreams || nc.Limits.StepStreams > nc.Limits.MaxInboundStreams/2 && nc.Limits.StepStreams > node.DefaultConfig().Limits.StepStreams {
			t.Errorf("%d nodes over %s: %d idle step streams; want at least %d and the default, at most half the inbound cap %d",
				tc.nodes, tc.transport, nc.Limits.StepStreams, want, nc.Limits.MaxInboundStreams)
		}
	}
}
