package node

import (
	"math"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pspnode/pspnode/gossip"
	"github.com/pspnode/pspnode/node/exchange"
	"github.com/pspnode/pspnode/node/netsetup"
	"github.com/pspnode/pspnode/psp"
)

// A sampled barrier needs a sampler pool of at least β peers: with a
// smaller pool every check would silently fall back to an unweighted
// shuffle of all known peers. Validate names both numbers and the fix.
func TestValidatePoolHoldsBeta(t *testing.T) {
	for _, tc := range []struct {
		barrier string
		pool    int
		ok      bool
	}{
		{"pssp:100:4", 64, false},
		{"pbsp:65", 64, false},
		{"pdssp:70:1:3", 64, false},
		{"pssp:100:4", 100, true},
		{"pssp:10:4", 64, true},
		{"pbsp:64", 64, true},
		{"ssp:4", 1, true}, // global barriers do not sample
		{"asp", 1, true},
	} {
		cfg := DefaultConfig()
		cfg.Barrier = psp.MustParse(tc.barrier)
		cfg.Overlay.PoolSize = tc.pool
		err := cfg.Validate()
		if tc.ok {
			if err != nil {
				t.Errorf("%s, pool %d: %v", tc.barrier, tc.pool, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("%s, pool %d: accepted", tc.barrier, tc.pool)
			continue
		}
		beta := cfg.Barrier.Beta
		for _, want := range []string{"β = " + strconv.Itoa(beta), "holds " + strconv.Itoa(tc.pool), "Overlay.PoolSize to at least " + strconv.Itoa(beta)} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s, pool %d: error %q does not say %q", tc.barrier, tc.pool, err, want)
			}
		}
	}
}

// Validate refuses each bad field, naming it as Config spells it, and
// checks the sub-configurations and the order of the bounds. (What the
// settings must agree on with New's options, TestOptionsAgreeWithConfig.)
func TestValidateNamesTheField(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(*Config)
		want string // in the error; "" for none
	}{
		{"defaults", func(*Config) {}, ""},
		{"local defaults", func(c *Config) { *c = DefaultLocalConfig() }, ""},
		{"bad job", func(c *Config) { c.Job = "a/b" }, "Job: job \"a/b\""},
		{"bad barrier", func(c *Config) { c.Barrier = psp.Spec{Kind: psp.SSP, Beta: 3} }, "Barrier: "},
		{"negative max steps", func(c *Config) { c.MaxSteps = -1 }, "MaxSteps must not be negative"},
		{"negative duration", func(c *Config) { c.Duration = -time.Second }, "Duration must not be negative (got -1s)"},
		{"negative start timeout", func(c *Config) { c.StartTimeout = -time.Second }, "StartTimeout must not be negative"},
		{"negative wait peers", func(c *Config) { c.WaitPeers = -1 }, "WaitPeers must not be negative"},
		{"negative checkpoint interval", func(c *Config) { c.CheckpointEvery = -1 }, "CheckpointEvery must not be negative"},
		{"negative step streams", func(c *Config) { c.Limits.StepStreams = -1 }, "Limits.StepStreams must not be negative"},
		{"poll share 0", func(c *Config) { c.Check.PollShare = 0 }, "Check.PollShare 0 must be in (0, 1]"},
		{"global poll share 2", func(c *Config) { c.Check.GlobalPollShare = 2 }, "Check.GlobalPollShare 2 must be in (0, 1]"},
		{"poll min 0", func(c *Config) { c.Check.PollMin = 0 }, "Check.PollMin must be a positive duration"},
		{"query timeout 0", func(c *Config) { c.Check.QueryTimeout = 0 }, "Check.QueryTimeout must be a positive duration"},
		// A cap below its floor wins (timing.go): one flag sets the interval.
		{"poll max under poll min", func(c *Config) { c.Check.PollMax = c.Check.PollMin / 2 }, ""},
		{"query timeout under its min", func(c *Config) { c.Check.QueryTimeout = c.Check.QueryTimeoutMin / 2 }, ""},
		{"conn low above high", func(c *Config) { c.Limits.ConnLow, c.Limits.ConnHigh = 10, 5 }, "Limits.ConnLow 10, Limits.ConnHigh 5: need 0 <= ConnLow <= ConnHigh"},
		{"per-peer streams above all", func(c *Config) { c.Limits.MaxStreamsPerPeer, c.Limits.MaxInboundStreams = 9, 8 }, "Limits.MaxStreamsPerPeer 9, Limits.MaxInboundStreams 8"},
		{"join retry min above max", func(c *Config) { c.Overlay.Join.RetryMin, c.Overlay.Join.RetryMax = time.Minute, time.Second }, "Join.RetryMin 1m0s, Join.RetryMax 1s"},
		{"infinite norm bound", func(c *Config) { c.Exchange.NormBound = math.Inf(1) }, "Exchange.NormBound +Inf"},
		{"screen off", func(c *Config) { c.Screen = psp.ScreenConfig{} }, ""},
		{"negative quarantine", func(c *Config) { c.Screen.Quarantine = -1 }, "Screen.Quarantine -1"},
		{"negative screen records", func(c *Config) { c.Screen.MaxPeers = -1 }, "Screen.MaxPeers must not be negative"},
		{"relay without traversal", func(c *Config) { c.NAT.Traversal = false }, "NAT.RelayService: "},
		{"epidemic:0", func(c *Config) { c.Exchange.Spec = exchange.Spec{Kind: exchange.Epidemic} }, "Exchange epidemic"},
		{"overlay bucket size", func(c *Config) { c.Overlay.BucketSize = 1 }, "BucketSize 1 < 2"},
		{"overlay lookups crossed", func(c *Config) { c.Overlay.MinLookups, c.Overlay.MaxLookups = 9, 8 }, "MaxLookups 8 < MinLookups 9"},
		{"overlay job left for the node", func(c *Config) { c.Overlay.Job = "" }, ""},
		{"gossip top-k fraction", func(c *Config) {
			c.Exchange.Spec, c.Gossip.Encoding, c.Gossip.TopKFraction = exchange.Spec{}, gossip.EncodingTopK32, 2
		}, "TopKFraction must be in (0, 1]"},
		{"gossip unused under epidemic", func(c *Config) {
			c.Exchange.Spec = exchange.Spec{Kind: exchange.Epidemic, S: 2}
			c.Gossip.MaxMessageSize = -1
		}, ""},
		{"gossip message size", func(c *Config) { c.Exchange.Spec, c.Gossip.MaxMessageSize = exchange.Spec{}, -1 }, "MaxMessageSize must be >= 0"},
		{"epidemic sends whole models", func(c *Config) { c.Gossip.Encoding = gossip.EncodingTopK16 }, "Gossip.Encoding: exchange epidemic:4 sends whole models"},
		{"exchange max value", func(c *Config) { c.Exchange.MaxAbsValue = 0 }, "Exchange.MaxAbsValue 0 must be positive"},
		{"bootstrap not TCP without id", func(c *Config) { c.Bootstrap = []string{"/ip4/1.2.3.4/udp/1/quic-v1"} }, "Bootstrap: bootstrap address"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			tc.set(&cfg)
			err := cfg.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && err == nil:
				t.Fatalf("accepted, want an error with %q", tc.want)
			case tc.want != "" && !strings.Contains(err.Error(), tc.want):
				t.Fatalf("error %q, want one with %q", err, tc.want)
			}
		})
	}
}

// A bad job is reported once, as Job, not again by the overlay and gossip
// checks that take it.
func TestValidateReportsJobOnce(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Job = ""
	err := cfg.Validate()
	if err == nil {
		t.Fatal("empty job accepted")
	}
	if n := strings.Count(err.Error(), `job ""`); n != 1 {
		t.Errorf("job reported %d times: %v", n, err)
	}
}

// DefaultLocalConfig is DefaultConfig with the local network's three
// settings and nothing else.
func TestDefaultLocalConfig(t *testing.T) {
	want := DefaultConfig()
	want.Listen = []string{"/ip4/127.0.0.1/tcp/0"}
	want.NAT = netsetup.NATConfig{}
	want.Check.QueryTimeout = 2 * time.Second
	if got := DefaultLocalConfig(); !reflect.DeepEqual(got, want) {
		t.Errorf("DefaultLocalConfig() = %+v\nwant %+v", got, want)
	}
}
