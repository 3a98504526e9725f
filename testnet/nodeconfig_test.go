package testnet

import (
	"log/slog"
	"reflect"
	"testing"
	"time"

	"github.com/pspnode/pspnode/gossip"
	"github.com/pspnode/pspnode/node"
	"github.com/pspnode/pspnode/node/exchange"
	"github.com/pspnode/pspnode/node/netsetup"
	"github.com/pspnode/pspnode/psp"
)

// handConfig is the node configuration the testnet built by hand from
// node.DefaultConfig before node.DefaultLocalConfig existed, kept here
// verbatim as the reference nodeConfig must match (less the logger, now
// an option of node.New).
func handConfig(t *testnet, joining bool) node.Config {
	cfg := node.DefaultConfig()
	cfg.Job = "testnet"
	cfg.Barrier = t.cfg.Barrier
	cfg.EvalEvery = 0
	cfg.JoinFetch = joining
	cfg.Genesis = testnetGenesis(t.cfg.Seed)
	cfg.QueryTimeout = 2 * time.Second
	cfg.NAT = netsetup.NATConfig{}
	cfg.Overlay.Logger = t.log
	cfg.Gossip.Logger = t.log
	enc, err := gossip.ParseEncoding(t.cfg.Encoding)
	if err != nil {
		panic(err)
	}
	cfg.Gossip.Encoding = enc
	cfg.Gossip.PeerScoring = true
	cfg.PollShare = t.cfg.PollShare
	cfg.Exchange.Spec = t.cfg.Exchange
	if t.cfg.NoScreen {
		cfg.Screen = psp.ScreenConfig{}
	}
	switch {
	case t.cfg.NormBound > 0:
		cfg.Exchange.NormBound = t.cfg.NormBound
	case t.cfg.NormBound < 0:
		cfg.Exchange.NormBound = 0
	}
	cfg.ConnLow, cfg.ConnHigh, cfg.Overlay.PoolSize = t.cfg.Limits()
	cfg.StepStreams = max(64, min(cfg.ConnHigh, 256))
	if t.cfg.StepStreams > 0 {
		cfg.StepStreams = t.cfg.StepStreams
	}
	cfg.Overlay = cfg.Overlay.ForSharedMachine(t.cfg.Nodes)
	if t.cfg.NoSybilDefence {
		cfg.Overlay.PerAddress = 0
	}
	if t.cfg.Transport == "tcp" {
		cfg.Listen = []string{"/ip4/127.0.0.1/tcp/0"}
	}
	return cfg
}

// The testnet's nodes, configured from node.DefaultLocalConfig, get the
// very values they had when the testnet overrode node.DefaultConfig by
// hand, field by field, whatever the testnet's settings: no figure moves.
// The one difference is Listen on the mem transport, where the node is
// given its host and listens on nothing itself.
func TestNodeConfigAsByHand(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*Config)
	}{
		{"defaults", func(*Config) {}},
		{"tcp", func(c *Config) { c.Transport = "tcp" }},
		{"1000 nodes", func(c *Config) { c.Nodes = 1000 }},
		{"150 nodes, pool set", func(c *Config) { c.Nodes, c.PoolSize, c.ConnLow, c.ConnHigh = 150, 40, 10, 20 }},
		{"pbsp:80, above the default pool", func(c *Config) { c.Barrier = psp.MustParse("pbsp:80") }},
		{"no screen, no sybil defence", func(c *Config) { c.NoScreen, c.NoSybilDefence = true, true }},
		{"norm bound set", func(c *Config) { c.NormBound = 2.5 }},
		{"norm bound off", func(c *Config) { c.NormBound = -1 }},
		{"top-k, poll share", func(c *Config) { c.Encoding, c.PollShare, c.Exchange = "topk16", 0.25, exchange.Spec{} }},
		{"epidemic", func(c *Config) { c.Exchange = exchange.Spec{Kind: exchange.Epidemic, S: 3} }},
		{"seed", func(c *Config) { c.Seed = 42 }},
		{"step streams set", func(c *Config) { c.StepStreams = 8 }},
		{"1000 nodes, step streams set", func(c *Config) { c.Nodes, c.StepStreams = 1000, 100 }},
	} {
		for _, joining := range []bool{false, true} {
			c := DefaultConfig()
			tc.mod(&c)
			tn := &testnet{cfg: c, log: slog.New(slog.DiscardHandler)}
			got, err := tn.nodeConfig(joining)
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			want := handConfig(tn, joining)
			if c.Transport != "tcp" {
				want.Listen = got.Listen
			}
			gv, wv := reflect.ValueOf(got), reflect.ValueOf(want)
			for i := range gv.NumField() {
				f := gv.Type().Field(i)
				if !f.IsExported() {
					continue
				}
				if !reflect.DeepEqual(gv.Field(i).Interface(), wv.Field(i).Interface()) {
					t.Errorf("%s, joining %v: %s = %+v, by hand %+v", tc.name, joining, f.Name, gv.Field(i).Interface(), wv.Field(i).Interface())
				}
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("%s, joining %v: configurations differ", tc.name, joining)
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
		c := DefaultConfig()
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
		want := min(high, nc.MaxInboundStreams/2)
		if tc.nodes <= 257 && !tc.trims {
			want = tc.nodes - 1 // at least: every peer
		}
		if nc.StepStreams < want || nc.StepStreams < node.DefaultConfig().StepStreams || nc.StepStreams > nc.MaxInboundStreams/2 && nc.StepStreams > node.DefaultConfig().StepStreams {
			t.Errorf("%d nodes over %s: %d idle step streams; want at least %d and the default, at most half the inbound cap %d",
				tc.nodes, tc.transport, nc.StepStreams, want, nc.MaxInboundStreams)
		}
	}
}
