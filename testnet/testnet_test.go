package testnet

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	kb "github.com/libp2p/go-libp2p-kbucket"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/internal/memnet"
	"github.com/pspnode/pspnode/internal/vclock"
	"github.com/pspnode/pspnode/node/exchange"
	"github.com/pspnode/pspnode/psp"
	"github.com/pspnode/pspnode/testnet/plan"
	"github.com/pspnode/pspnode/testnet/report"
)

func TestParseScript(t *testing.T) {
	evs, err := plan.ParseScript(strings.NewReader("# comment\n60s crash 10%\n\n 30s join 5 # trailing\n90s leave 2\n100s partition 50%\n160s heal\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 5 || evs[3].Action != plan.Partition || evs[3].Fraction != 0.5 || evs[4].Action != plan.Heal || evs[0].Action != plan.Join || evs[0].Count != 5 || evs[1].Fraction != 0.1 || evs[2].At != 90*time.Second {
		t.Errorf("parsed %+v", evs)
	}
	for _, bad := range []string{
		"60s crash", "60 crash 1", "-5s join 1", "60s explode 1", "60s heal 2 3", "60s join 0", "60s join 101%", "60s join x", "60s join 1 extra",
	} {
		if _, err := plan.ParseScript(strings.NewReader(bad)); err == nil || !strings.Contains(err.Error(), "line 1") {
			t.Errorf("%q: want an error naming line 1, got %v", bad, err)
		}
	}
}

func FuzzParseScript(f *testing.F) {
	f.Add("60s crash 10%\n30s join 5\n")
	f.Add("1h leave 100%")
	f.Add("#\n\n5ms join 1 # x")
	f.Fuzz(func(t *testing.T, s string) {
		evs, err := plan.ParseScript(strings.NewReader(s))
		if err != nil {
			return
		}
		for i, e := range evs {
			if e.At < 0 || (e.Count < 1 && !(e.Fraction > 0 && e.Fraction <= 1)) {
				t.Fatalf("accepted a bad event %+v", e)
			}
			if i > 0 && evs[i-1].At > e.At {
				t.Fatal("events out of order")
			}
		}
	})
}

func TestConfigValidate(t *testing.T) {
	for _, mod := range []func(*plan.Config){
		func(c *plan.Config) { c.Nodes = 1 },
		func(c *plan.Config) { c.Duration = 0 },
		func(c *plan.Config) { c.Model = "cnn" },
		func(c *plan.Config) { c.Transport = "udp" },
		func(c *plan.Config) { c.Transport, c.Nodes = "tcp", 1000 },
		func(c *plan.Config) { c.Stragglers = 2 },
		func(c *plan.Config) { c.Barrier = psp.Spec{} },
		func(c *plan.Config) { c.ConnLow, c.ConnHigh = 100, 50 },
		func(c *plan.Config) { c.ConnLow = 500 }, // above the default high watermark
		func(c *plan.Config) { c.PoolSize = -1 },
		func(c *plan.Config) { c.ConnGrace = -time.Second },
		func(c *plan.Config) { c.StepStreams = -1 },
		func(c *plan.Config) { c.Clock = "wall" },
		func(c *plan.Config) { c.Transport = "tcp" }, // virtual clock: no real sockets
		func(c *plan.Config) { c.TimeScale = 0 },     // virtual clock: compute takes no time
		func(c *plan.Config) { c.TimeScale = -1 },
		func(c *plan.Config) { c.Clock, c.TimeScale = plan.Real, -0.5 },
		func(c *plan.Config) { c.Latency = plan.Latency{Min: 20 * time.Millisecond, Max: 10 * time.Millisecond} },
		func(c *plan.Config) { c.Bandwidth = -1 },
		func(c *plan.Config) { c.Clock, c.Transport, c.Bandwidth = plan.Real, "tcp", 1e6 },
		func(c *plan.Config) { c.Roles = []plan.RoleShare{{Role: plan.SybilZone, Fraction: 1}} },
		func(c *plan.Config) { c.Roles = []plan.RoleShare{{Role: plan.SybilHost, Fraction: 0}} },
		func(c *plan.Config) { c.Roles = []plan.RoleShare{{Role: "sybil", Fraction: 0.1}} },
		func(c *plan.Config) {
			c.Roles = []plan.RoleShare{{Role: plan.SybilZone, Fraction: 0.5}, {Role: plan.LiarZero, Fraction: 0.5}}
		},
		func(c *plan.Config) {
			c.Roles, c.SybilPrefix = []plan.RoleShare{{Role: plan.SybilZone, Fraction: 0.1}}, plan.MaxSybilPrefix+1
		},
		func(c *plan.Config) { c.SybilPrefix = -1 },
		func(c *plan.Config) { c.SybilVictims = -1 },
		func(c *plan.Config) {
			c.Roles, c.Nodes, c.SybilVictims = []plan.RoleShare{{Role: plan.SybilZone, Fraction: 0.8}}, 10, 3
		}, // 2 honest nodes
		func(c *plan.Config) {
			c.Clock, c.Transport, c.Roles = plan.Real, "tcp", []plan.RoleShare{{Role: plan.SybilHost, Fraction: 0.1}}
		},
		func(c *plan.Config) { c.Roles = []plan.RoleShare{{Role: plan.PoisonNorm, Fraction: 0.1}} }, // counted over gossip only
		func(c *plan.Config) {
			c.Roles, c.Exchange = []plan.RoleShare{{Role: plan.DriftPoison, Fraction: 0.1}}, exchange.Spec{}
		}, // epidemic only
		func(c *plan.Config) {
			c.Roles, c.Model = []plan.RoleShare{{Role: plan.DriftPoison, Fraction: 0.1}}, "none"
		}, // a model to push
	} {
		c := plan.DefaultConfig()
		mod(&c)
		if c.Validate() == nil {
			t.Errorf("config %+v should be invalid", c)
		}
	}
	// The real clock takes real compute only, and real sockets.
	for _, mod := range []func(*plan.Config){
		func(c *plan.Config) { c.Clock, c.TimeScale = plan.Real, 0 },
		func(c *plan.Config) { c.Clock, c.Transport = plan.Real, "tcp" },
	} {
		c := plan.DefaultConfig()
		mod(&c)
		if err := c.Validate(); err != nil {
			t.Errorf("config %+v: %v", c, err)
		}
	}
}

func TestParseRoles(t *testing.T) {
	tests := []struct {
		in      string
		want    []plan.RoleShare
		wantErr bool
	}{
		{"liar-zero:5%", []plan.RoleShare{{Role: plan.LiarZero, Fraction: 0.05}}, false},
		{"poison-nan:0.1, flooder:1%", []plan.RoleShare{{Role: plan.PoisonNaN, Fraction: 0.1}, {Role: plan.Flooder, Fraction: 0.01}}, false},
		{"", nil, false},
		{"liar:5%", nil, true},
		{"liar-zero", nil, true},
		{"liar-zero:0%", nil, true},
		{"liar-zero:120%", nil, true},
		{"liar-zero:60%,slow:50%", nil, true},
		{"sybil-zone:10%", []plan.RoleShare{{Role: plan.SybilZone, Fraction: 0.1}}, false},
		{"sybil-host:0.05,sybil-zone:5%", []plan.RoleShare{{Role: plan.SybilHost, Fraction: 0.05}, {Role: plan.SybilZone, Fraction: 0.05}}, false},
		{"sybil-zone:0.999", []plan.RoleShare{{Role: plan.SybilZone, Fraction: 0.999}}, false},
		{"sybil-zone:1", nil, true},    // no honest node left
		{"sybil-host:100%", nil, true}, // the same
		{"sybil-zone:0", nil, true},
		{"sybil-zone:-5%", nil, true},
		{"sybil-zone:1.5", nil, true},
		{"sybil-zone:NaN", nil, true},
		{"sybil-zone:", nil, true},
		{"sybil-zone:ten", nil, true},
		{"sybil:10%", nil, true},
		{"Sybil-Zone:10%", nil, true},
		{"sybil-zone:50%,sybil-host:50%", nil, true},
	}
	for _, tt := range tests {
		got, err := plan.ParseRoles(tt.in)
		if (err != nil) != tt.wantErr {
			t.Errorf("ParseRoles(%q) error %v, want error %v", tt.in, err, tt.wantErr)
			continue
		}
		if !tt.wantErr && !slices.Equal(got, tt.want) {
			t.Errorf("ParseRoles(%q) = %v, want %v", tt.in, got, tt.want)
		}
	}
	roles := plan.AssignRoles(100, []plan.RoleShare{{Role: plan.LiarZero, Fraction: 0.05}, {Role: plan.PoisonNaN, Fraction: 0.1}}, 1)
	count := map[plan.Role]int{}
	for _, r := range roles {
		count[r]++
	}
	if count[plan.LiarZero] != 5 || count[plan.PoisonNaN] != 10 || count[plan.Honest] != 85 {
		t.Errorf("assignRoles: %v", count)
	}
}

// smallConfig is the 20-node pSSP(5,2) testnet the tests run: fast steps,
// short stall window, frequent evaluation.
func smallConfig(d time.Duration) plan.Config {
	cfg := plan.DefaultConfig()
	cfg.Nodes = 20
	cfg.Duration = d
	cfg.TimeScale = 0.05
	cfg.Barrier = psp.MustParse("pssp:5:2")
	cfg.StallWindow = 3 * time.Second
	cfg.EvalEvery = 2 * time.Second
	return cfg
}

// runLogged runs a testnet on the virtual clock (or, with Clock Real, on
// the machine's) and logs its summary. On the virtual clock the run is
// pace-independent: time moves only when every node waits.
func runLogged(t *testing.T, cfg plan.Config) *report.Result {
	t.Helper()
	var res *report.Result
	run := func(t *testing.T) {
		var err error
		res, err = Run(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
	}
	if cfg.Clock == plan.Virtual {
		vclock.Test(t, run)
	} else {
		run(t)
	}
	if res == nil {
		t.FailNow()
	}
	var sb strings.Builder
	res.PrintSummary(&sb)
	t.Log("\n" + sb.String())
	return res
}

// TestNoteFree checks the stall rule: a stall is a whole window free to go
// on (barrier open, not computing) without progress; a long computation or
// a closed barrier restarts the clock.
func TestNoteFree(t *testing.T) {
	const w = 30 * time.Second
	sec := func(s int) time.Duration { return time.Duration(s) * time.Second }
	tests := []struct {
		name  string
		ticks []bool // free at 0 s, 10 s, 20 s, ...
		want  bool   // stalled at the last tick
	}{
		{"free a whole window", []bool{true, true, true, true}, true},
		{"free just short of it", []bool{true, true, true}, false},
		{"busy in between", []bool{true, true, false, true, true}, false},
		{"free after a long computation", []bool{false, false, false, true, true, true, true}, true},
		{"never free", []bool{false, false, false, false, false}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := &member{freeSince: -1}
			var got bool
			for i, free := range tc.ticks {
				got = m.noteFree(sec(10*i), free, w)
			}
			if got != tc.want {
				t.Errorf("stalled = %v, want %v", got, tc.want)
			}
		})
	}
}

// A node is free to go on from its launch: one that never steps is
// stalled at the first record a window later, even when the recorder,
// starved of CPU, took no record in between. The window used to start at
// the first record that found the node free.
func TestStalledFromLaunch(t *testing.T) {
	const w = 30 * time.Second
	m := &member{freeSince: -1}
	m.launched(0, 0)
	if !m.noteFree(w, true, w) {
		t.Error("a node free since its launch a whole window ago is not stalled")
	}
	m.launched(0, 0)
	if m.noteFree(w-time.Second, true, w) {
		t.Error("stalled before a whole window")
	}
}

// The stall rule counts a node that has computed one step for far longer
// than the time model allows as free to go on: a step of 0.1 s that takes
// a minute is the machine's stall, not a straggler's step. It used to
// count every node inside its task's Step as busy, however long.
func TestStallFree(t *testing.T) {
	const long = time.Second // stallStepShare × a 0.1-s mean step
	for _, tc := range []struct {
		name               string
		allowed, computing bool
		since, longest     time.Duration
		want               bool
	}{
		{"waiting, barrier open", true, false, time.Minute, long, true},
		{"barrier closed", false, false, time.Minute, long, false},
		{"computing a plausible step", true, true, 500 * time.Millisecond, long, false},
		{"computing one step for a minute", true, true, time.Minute, long, true},
		{"computing for a minute, barrier closed", false, true, time.Minute, long, false},
		{"no time model: computing is busy", true, true, time.Hour, 0, false},
	} {
		if got := stallFree(tc.allowed, tc.computing, tc.since, tc.longest); got != tc.want {
			t.Errorf("%s: free %v, want %v", tc.name, got, tc.want)
		}
	}
	tn := &testnet{cfg: plan.Config{TimeScale: 0.05}}
	if got := tn.longestStep(&member{factor: 4}); got != 4*time.Second {
		t.Errorf("longest step of a straggler (×4) at time scale 0.05: %v, want 4 s", got)
	}
}

// grindKey finds keys whose DHT key shares the asked prefix with the
// target, within its bound, and the same keys for the same stream.
func TestGrindKey(t *testing.T) {
	target := kb.ConvertKey("victim")
	total := 0
	for i := range 8 {
		id, err := grindKey(memnet.KeySource(uint64(i+1), "grind"), target, 6)
		if err != nil {
			t.Fatal(err)
		}
		p, err := peer.IDFromPrivateKey(id.key)
		if err != nil {
			t.Fatal(err)
		}
		if c := kb.CommonPrefixLen(kb.ConvertPeerID(p), target); c < 6 {
			t.Errorf("ground key shares %d bits, want >= 6", c)
		}
		if id.keygens < 1 || id.keygens > 64<<6 {
			t.Errorf("%d keys generated, want 1 to %d", id.keygens, 64<<6)
		}
		total += id.keygens
		again, _ := grindKey(memnet.KeySource(uint64(i+1), "grind"), target, 6)
		if !again.key.Equals(id.key) {
			t.Error("the same stream ground a different key")
		}
	}
	// 2^6 tries on average: 8 grinds take 512, and far more than 4× that
	// would mean the prefix is not what is searched for.
	t.Logf("%d keys generated for 8 prefixes of 6 bits", total)
	if total > 4*8<<6 {
		t.Errorf("%d keys generated for 8 prefixes of 6 bits, want about %d", total, 8<<6)
	}
}
