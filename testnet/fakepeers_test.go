package testnet

import (
	"strings"
	"testing"
	"time"

	"github.com/pspnode/pspnode/overlay"
	"github.com/pspnode/pspnode/testnet/plan"
)

// TestFakePeersRole runs fake-peers nodes small on the virtual clock: they
// name many made-up peers, and the honest nodes keep at most
// MaxUnconfirmed of them, never draw one, and train as usual.
func TestFakePeersRole(t *testing.T) {
	cfg := tinyConfig(24, 20*time.Second)
	cfg.Roles = []plan.RoleShare{{Role: plan.FakePeers, Fraction: 0.125}} // 3 of 24
	res := runLogged(t, cfg)
	h, mb := res.Hostile, res.Membership
	if h == nil || h.Nodes[string(plan.FakePeers)] != 3 || mb == nil {
		t.Fatalf("hostile %+v, membership %+v", h, mb)
	}
	bound := overlay.DefaultConfig().MaxUnconfirmed
	if h.FakePeersNamed < 10*bound {
		t.Errorf("%d made-up peers named: too few to test the bound of %d", h.FakePeersNamed, bound)
	}
	if mb.UnconfirmedMax > bound || mb.MembersMax > cfg.Nodes-1+bound {
		t.Errorf("membership %+v: want at most %d unconfirmed, %d members", *mb, bound, cfg.Nodes-1+bound)
	}
	// Dead or alive, the peers a node knows only from others are bounded
	// too: the made-up peers it found dead count against the same bound.
	if known := mb.Members + mb.Dead; known > float64(cfg.Nodes-1+bound) {
		t.Errorf("%.0f peers known per honest node (%.0f live, %.0f dead), want at most %d", known, mb.Members, mb.Dead, cfg.Nodes-1+bound)
	}
	if mb.Drawable > float64(cfg.Nodes-1) {
		t.Errorf("%.1f drawable peers on average, more than the %d real others", mb.Drawable, cfg.Nodes-1)
	}
	if res.StalledNodes != 0 || res.Steps.Min < 3 || res.Population.MedianRelError > 0.1 {
		t.Errorf("honest nodes: steps %+v, %d stalled, population error %.3f", res.Steps, res.StalledNodes, res.Population.MedianRelError)
	}
	if res.Sampling.Draws == 0 {
		t.Fatal("no barrier samples")
	}
	var sb strings.Builder
	res.PrintSummary(&sb)
	if !strings.Contains(sb.String(), "made-up peers named") || !strings.Contains(sb.String(), "membership") {
		t.Errorf("summary has no fake-peers or membership rows:\n%s", sb.String())
	}
}
