package testnet

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/pspnode/pspnode/testnet/plan"
	"github.com/pspnode/pspnode/testnet/report"
)

// TestSybilRoles runs both Sybil roles small on the virtual clock: the
// JSON carries the Sybil figures, in range, and the address limits cut
// what identities behind one address are drawn: about one address's share
// with the defence, about their share of identities without it.
func TestSybilRoles(t *testing.T) {
	host := func(defence bool) *report.SybilFigures {
		cfg := tinyConfig(24, 4*time.Second)
		cfg.Roles = []plan.RoleShare{{Role: plan.SybilHost, Fraction: 0.25}}
		cfg.NoSybilDefence = !defence
		res := runLogged(t, cfg)
		f := sybilJSON(t, res)
		if f.IDShare != 0.25 || f.AddrShare != 1.0/19 || f.Defence != defence || f.Victims != 0 {
			t.Errorf("sybil-host: figures %+v, want 6 of 24 identities on 1 of 19 addresses", f)
		}
		if f.HonestDraws < 300 || !(f.SampleShare >= 0 && f.SampleShare <= 1) {
			t.Errorf("sybil-host: %d honest draws, sample share %v", f.HonestDraws, f.SampleShare)
		}
		return f
	}
	on, off := host(true), host(false)
	// 18 honest nodes each draw from 17 others and the 6 Sybils: with the
	// defence the Sybils weigh 1 peer in 18 (5.6 %), without it 6 in 23
	// (26 %).
	if on.SampleShare > 2*on.AddrShare || off.SampleShare < off.IDShare/2 || on.SampleShare > off.SampleShare/2 {
		t.Errorf("sybil-host sample share %.3f with the defence, %.3f without: want at most 2 × the address share (%.3f) with, about the identity share (%.3f) without",
			on.SampleShare, off.SampleShare, on.AddrShare, off.IDShare)
	}

	cfg := tinyConfig(24, 4*time.Second)
	cfg.Roles = []plan.RoleShare{{Role: plan.SybilZone, Fraction: 0.25}}
	cfg.SybilPrefix = 8
	res := runLogged(t, cfg)
	f := sybilJSON(t, res)
	if f.IDShare != 0.25 || f.AddrShare != 0.25 || f.Victims != plan.DefaultSybilVictims || f.PrefixBits != 8 {
		t.Errorf("sybil-zone: figures %+v", f)
	}
	if !(f.KeygensMean >= 1 && f.KeygensMean <= 64<<8) {
		t.Errorf("sybil-zone: %.0f keys generated per Sybil, want within the bound", f.KeygensMean)
	}
	for name, v := range map[string]float64{"sample share": f.SampleShare, "victims' sample share": f.VictimSampleShare,
		"victim error": f.VictimError, "victim p95 error": f.VictimErrorP95, "victim zone error": f.VictimZoneError} {
		if !(v >= 0 && v <= 1) {
			t.Errorf("sybil-zone: %s %v out of [0, 1]", name, v)
		}
	}
	if res.StalledNodes != 0 || res.Steps.Min < 3 {
		t.Errorf("sybil-zone: honest nodes: steps %+v, %d stalled", res.Steps, res.StalledNodes)
	}
	var sb strings.Builder
	res.PrintSummary(&sb)
	if !strings.Contains(sb.String(), "victims") || !strings.Contains(sb.String(), "of honest barrier-sample draws") {
		t.Errorf("summary has no Sybil rows:\n%s", sb.String())
	}
}

// sybilJSON returns the Sybil figures as the JSON carries them, failing
// the test when any is missing.
func sybilJSON(t *testing.T, res *report.Result) *report.SybilFigures {
	t.Helper()
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	var raw struct {
		Hostile map[string]any `json:"hostile"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"sybil_id_share", "sybil_addr_share", "sybil_sample_share", "sybil_honest_draws", "sybil_defence", "sybil_victim_median_rel_error"} {
		if _, ok := raw.Hostile[k]; !ok {
			t.Errorf("hostile JSON has no %s: %v", k, raw.Hostile)
		}
	}
	if res.Hostile == nil || res.Hostile.SybilFigures == nil {
		t.Fatal("no Sybil figures")
	}
	return res.Hostile.SybilFigures
}
