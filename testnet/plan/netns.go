package plan

import (
	"fmt"
	"strconv"
	"strings"
)

// CPUQuota gives a Fraction of a netns testnet's nodes Cores CPUs each
// (a cgroup CPU quota): stragglers whose slowness is real compute.
type CPUQuota struct {
	Fraction float64
	Cores    float64
}

// ParseCPUQuota reads "F:Q", a fraction of the nodes and the cores each of
// them gets ("0.25:0.1"), or "" for none.
func ParseCPUQuota(s string) (CPUQuota, error) {
	if s == "" {
		return CPUQuota{}, nil
	}
	f, q, ok := strings.Cut(s, ":")
	a, err1 := strconv.ParseFloat(f, 64)
	b, err2 := strconv.ParseFloat(q, 64)
	if !ok || err1 != nil || err2 != nil || !(a > 0 && a <= 1) || !(b >= 0.01 && b <= 1024) {
		return CPUQuota{}, fmt.Errorf("cpu quota %q: want FRACTION:CORES with a fraction of the nodes in (0, 1] and cores in [0.01, 1024], e.g. 0.25:0.1", s)
	}
	return CPUQuota{a, b}, nil
}

// netnsMaxNodes bounds a netns testnet: each node is a process with its
// own Go runtime (about 30–50 MiB resident).
const netnsMaxNodes = 300

// validateNetns checks what the netns transport supports: it links nodes
// with tc tbf (a rate), not netem (delay and loss), and runs each node as
// a plain `pspnode run`, without the in-process testnet's churn and
// hostile roles.
func (c Config) validateNetns() []error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if c.Nodes > netnsMaxNodes {
		bad("netns transport: %d nodes, at most %d (a process each)", c.Nodes, netnsMaxNodes)
	}
	if c.Latency.Max > 0 || c.Loss > 0 {
		bad("netns transport: link latency and loss need tc's netem qdisc, which it does not use (netem is missing from this kind of kernel); it supports --bandwidth (tc tbf); use --transport mem for latency and loss")
	}
	if c.Churn > 0 || len(c.Script) > 0 {
		bad("netns transport: churn and churn scripts need --transport mem or tcp")
	}
	if len(c.Roles) > 0 || c.NoScreen || c.NormBound != 0 {
		bad("netns transport: hostile roles, --no-screen and --norm-bound need --transport mem or tcp")
	}
	if c.Encoding != "dense32" {
		bad("netns transport: pspnode run sends dense32 updates; encoding %s needs --transport mem or tcp", c.Encoding)
	}
	if c.NAT < 0 || c.NAT > c.Nodes-1 {
		bad("nat %d: want 0 to nodes-1 = %d (node 0, the bootstrap node, stays public)", c.NAT, c.Nodes-1)
	}
	if c.CPUQuota != (CPUQuota{}) && !(c.CPUQuota.Fraction > 0 && c.CPUQuota.Fraction <= 1 && c.CPUQuota.Cores >= 0.01) {
		bad("cpu quota %v: want a fraction in (0, 1] and at least 0.01 cores", c.CPUQuota)
	}
	return errs
}
