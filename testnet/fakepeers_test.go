package testnet

import (
	"strings"
	"testing"
	"time"
)

// TestFakePeersRole runs fake-peers nodes small on the virtual clock: they
// name many made-up peers, the honest nodes never draw one, train as
// usual, and the result says what their overlays hold.
func TestFakePeersRole(t *testing.T) {
	cfg := tinyConfig(24, 20*time.Second)
	cfg.Roles = []RoleShare{{FakePeers, 0.125}} // 3 of 24
	res := runLogged(t, cfg)
	h, mb := res.Hostile, res.Membership
	if h == nil || h.Nodes[string(FakePeers)] != 3 || mb == nil {
		t.Fatalf("hostile %+v, membership %+v", h, mb)
	}
	if h.FakePeersNamed < 1000 {
		t.Errorf("%d made-up peers named", h.FakePeersNamed)
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
