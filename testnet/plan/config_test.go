package plan

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pspnode/pspnode/node/exchange"
	"github.com/pspnode/pspnode/psp"
)

func TestParseScript(t *testing.T) {
	evs, err := ParseScript(strings.NewReader("# comment\n60s crash 10%\n\n 30s join 5 # trailing\n90s leave 2\n100s partition 50%\n160s heal\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 5 || evs[3].Action != Partition || evs[3].Fraction != 0.5 || evs[4].Action != Heal || evs[0].Action != Join || evs[0].Count != 5 || evs[1].Fraction != 0.1 || evs[2].At != 90*time.Second {
		t.Errorf("parsed %+v", evs)
	}
	for _, bad := range []string{
		"60s crash", "60 crash 1", "-5s join 1", "60s explode 1", "60s heal 2 3", "60s join 0", "60s join 101%", "60s join x", "60s join 1 extra",
	} {
		if _, err := ParseScript(strings.NewReader(bad)); err == nil || !strings.Contains(err.Error(), "line 1") {
			t.Errorf("%q: want an error naming line 1, got %v", bad, err)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	for _, mod := range []func(*Config){
		func(c *Config) { c.Nodes = 1 },
		func(c *Config) { c.Duration = 0 },
		func(c *Config) { c.Model = "cnn" },
		func(c *Config) { c.Transport = "udp" },
		func(c *Config) { c.Transport, c.Nodes = "tcp", 1000 },
		func(c *Config) { c.Stragglers = 2 },
		func(c *Config) { c.Barrier = psp.Spec{} },
		func(c *Config) { c.ConnLow, c.ConnHigh = 100, 50 },
		func(c *Config) { c.ConnLow = 500 }, // above the default high watermark
		func(c *Config) { c.PoolSize = -1 },
		func(c *Config) { c.ConnGrace = -time.Second },
		func(c *Config) { c.StepStreams = -1 },
		func(c *Config) { c.Clock = "wall" },
		func(c *Config) { c.Transport = "tcp" }, // virtual clock: no real sockets
		func(c *Config) { c.TimeScale = 0 },     // virtual clock: compute takes no time
		func(c *Config) { c.TimeScale = -1 },
		func(c *Config) { c.Clock, c.TimeScale = Real, -0.5 },
		func(c *Config) { c.Latency = Latency{Min: 20 * time.Millisecond, Max: 10 * time.Millisecond} },
		func(c *Config) { c.Bandwidth = -1 },
		func(c *Config) { c.Clock, c.Transport, c.Bandwidth = Real, "tcp", 1e6 },
		func(c *Config) { c.Roles = []RoleShare{{Role: SybilZone, Fraction: 1}} },
		func(c *Config) { c.Roles = []RoleShare{{Role: SybilHost, Fraction: 0}} },
		func(c *Config) { c.Roles = []RoleShare{{Role: "sybil", Fraction: 0.1}} },
		func(c *Config) {
			c.Roles = []RoleShare{{Role: SybilZone, Fraction: 0.5}, {Role: LiarZero, Fraction: 0.5}}
		},
		func(c *Config) {
			c.Roles, c.SybilPrefix = []RoleShare{{Role: SybilZone, Fraction: 0.1}}, MaxSybilPrefix+1
		},
		func(c *Config) { c.SybilPrefix = -1 },
		func(c *Config) { c.SybilVictims = -1 },
		func(c *Config) {
			c.Roles, c.Nodes, c.SybilVictims = []RoleShare{{Role: SybilZone, Fraction: 0.8}}, 10, 3
		}, // 2 honest nodes
		func(c *Config) {
			c.Clock, c.Transport, c.Roles = Real, "tcp", []RoleShare{{Role: SybilHost, Fraction: 0.1}}
		},
		func(c *Config) { c.Roles = []RoleShare{{Role: PoisonNorm, Fraction: 0.1}} }, // counted over gossip only
		func(c *Config) {
			c.Roles, c.Exchange = []RoleShare{{Role: DriftPoison, Fraction: 0.1}}, exchange.Spec{}
		}, // epidemic only
		func(c *Config) {
			c.Roles, c.Model = []RoleShare{{Role: DriftPoison, Fraction: 0.1}}, "none"
		}, // a model to push
	} {
		c := DefaultConfig()
		mod(&c)
		if c.Validate() == nil {
			t.Errorf("config %+v should be invalid", c)
		}
	}
	// The real clock takes real compute only, and real sockets.
	for _, mod := range []func(*Config){
		func(c *Config) { c.Clock, c.TimeScale = Real, 0 },
		func(c *Config) { c.Clock, c.Transport = Real, "tcp" },
	} {
		c := DefaultConfig()
		mod(&c)
		if err := c.Validate(); err != nil {
			t.Errorf("config %+v: %v", c, err)
		}
	}
}

func TestParseRoles(t *testing.T) {
	tests := []struct {
		in      string
		want    []RoleShare
		wantErr bool
	}{
		{"liar-zero:5%", []RoleShare{{Role: LiarZero, Fraction: 0.05}}, false},
		{"poison-nan:0.1, flooder:1%", []RoleShare{{Role: PoisonNaN, Fraction: 0.1}, {Role: Flooder, Fraction: 0.01}}, false},
		{"", nil, false},
		{"liar:5%", nil, true},
		{"liar-zero", nil, true},
		{"liar-zero:0%", nil, true},
		{"liar-zero:120%", nil, true},
		{"liar-zero:60%,slow:50%", nil, true},
		{"sybil-zone:10%", []RoleShare{{Role: SybilZone, Fraction: 0.1}}, false},
		{"sybil-host:0.05,sybil-zone:5%", []RoleShare{{Role: SybilHost, Fraction: 0.05}, {Role: SybilZone, Fraction: 0.05}}, false},
		{"sybil-zone:0.999", []RoleShare{{Role: SybilZone, Fraction: 0.999}}, false},
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
		got, err := ParseRoles(tt.in)
		if (err != nil) != tt.wantErr {
			t.Errorf("ParseRoles(%q) error %v, want error %v", tt.in, err, tt.wantErr)
			continue
		}
		if !tt.wantErr && !slices.Equal(got, tt.want) {
			t.Errorf("ParseRoles(%q) = %v, want %v", tt.in, got, tt.want)
		}
	}
	roles := AssignRoles(100, []RoleShare{{Role: LiarZero, Fraction: 0.05}, {Role: PoisonNaN, Fraction: 0.1}}, 1)
	count := map[Role]int{}
	for _, r := range roles {
		count[r]++
	}
	if count[LiarZero] != 5 || count[PoisonNaN] != 10 || count[Honest] != 85 {
		t.Errorf("assignRoles: %v", count)
	}
}
