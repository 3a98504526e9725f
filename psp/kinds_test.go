package psp

import (
	"fmt"
	"strings"
	"testing"
)

// TestKindsTable checks what the code reading the table assumes of every
// entry, so that a new entry that breaks an assumption fails here rather
// than in a node.
func TestKindsTable(t *testing.T) {
	names := map[string]bool{}
	for i, k := range Kinds() {
		if k.Kind != Kind(i+1) {
			t.Errorf("entry %d is Kind %d: the table must follow the constants", i, k.Kind)
		}
		if info, ok := k.Kind.Info(); !ok || info.Name != k.Name || k.Kind.String() != k.Name {
			t.Errorf("%s: Info = %+v, %v; String %q", k.Name, info, ok, k.Kind)
		}
		if k.Name == "" || k.Name == "auto" || strings.Trim(k.Name, "abcdefghijklmnopqrstuvwxyz") != "" || names[k.Name] {
			t.Errorf("kind name %q: want a new lower-case word, not auto", k.Name)
		}
		names[k.Name] = true
		fields := map[Field]bool{}
		params := map[string]bool{}
		for _, p := range k.Params {
			if p.Field < FieldBeta || p.Field > FieldUpper || fields[p.Field] || p.Name == "" || params[p.Name] || strings.Contains(p.Name, ":") {
				t.Errorf("%s: parameter %+v: want a new field and a new name", k.Name, p)
			}
			fields[p.Field], params[p.Name] = true, true
		}
		if k.Scope < NoCheck || k.Scope > Sampled {
			t.Errorf("%s: scope %d", k.Name, k.Scope)
		}
		if (k.Scope == Sampled) != k.Takes(FieldBeta) {
			t.Errorf("%s: a kind takes a sample size iff it samples", k.Name)
		}
		if k.Scope == NoCheck && len(k.Params) > 0 {
			t.Errorf("%s: a kind that never checks takes no parameters", k.Name)
		}
		if k.Dynamic != k.Takes(FieldUpper) || (k.Dynamic && !k.Takes(FieldStaleness)) {
			t.Errorf("%s: a dynamic kind, and only one, takes S_L and S_U", k.Name)
		}
		if k.Pace && (k.Scope != Sampled || k.Dynamic) {
			t.Errorf("%s: the pace rule is for sampled static kinds", k.Name)
		}
		if k.Server && (!k.Dynamic || k.Scope != Everyone) {
			t.Errorf("%s: the server-based baseline (DSSPController) is a global dynamic barrier", k.Name)
		}
		if k.Help == "" || strings.Contains(k.Help, "\n") {
			t.Errorf("%s: help %q: want one line", k.Name, k.Help)
		}
		if !strings.Contains(Grammar, k.Form()) || !strings.Contains(KindsHelp(""), k.Form()+" ") {
			t.Errorf("%s: %s is missing from the grammar or the help", k.Name, k.Form())
		}
		// Every kind's spec with every parameter set parses back to itself.
		sp := Spec{Kind: k.Kind}
		for j, p := range k.Params {
			*sp.field(p.Field) = j + 1
		}
		if err := sp.Validate(); err != nil {
			t.Errorf("%s: %+v: %v", k.Name, sp, err)
		}
		if back, err := Parse(sp.String()); err != nil || back != sp {
			t.Errorf("%s: Parse(%q) = %+v, %v", k.Name, sp, back, err)
		}
	}
	// The copies handed out do not reach the table.
	ks := Kinds()
	ks[PSSP-1].Params[0].Name, ks[PSSP-1].Name = "X", "x"
	info, _ := PSSP.Info()
	info.Params[1].Field = FieldUpper
	if PSSP.String() != "pssp" || MustParse("pssp:3:2") != (Spec{Kind: PSSP, Beta: 3, Staleness: 2}) || !strings.Contains(Grammar, "pssp:B:S") {
		t.Error("changing the copies of the table changed it")
	}
	if _, ok := Kind(0).Info(); ok {
		t.Error("Kind 0 is valid")
	}
	if _, ok := Kind(len(Kinds()) + 1).Info(); ok {
		t.Error("the Kind after the table's is valid")
	}
}

func TestKindList(t *testing.T) {
	tests := []struct {
		conj string
		keep func(KindInfo) bool
		want string
	}{
		{"or", func(k KindInfo) bool { return k.Scope == Sampled }, "pbsp, pssp or pdssp"},
		{"and", func(k KindInfo) bool { return k.Pace }, "pbsp and pssp"},
		{"and", func(k KindInfo) bool { return k.Server }, "dssp"},
		{"and", func(KindInfo) bool { return false }, ""},
	}
	for _, tt := range tests {
		if got := KindList(tt.conj, tt.keep); got != tt.want {
			t.Errorf("KindList = %q, want %q", got, tt.want)
		}
	}
}

// The Checker asks the peers its kind's Scope names: none, every known
// peer, or a draw of β.
func TestCheckerFollowsScope(t *testing.T) {
	for _, k := range Kinds() {
		sp := Spec{Kind: k.Kind}
		for _, p := range k.Params {
			*sp.field(p.Field) = 2
		}
		c := NewChecker(CheckConfig{Spec: sp, Timing: DefaultTimingConfig(), Pace: DefaultPaceConfig()}, nil)
		c.Start(CheckStart{Self: 5, Population: 10})
		out := c.Ready()
		switch k.Scope {
		case NoCheck:
			if !out.Done || !out.Pass || out.Draw != 0 || out.Known {
				t.Errorf("%s: %+v, want an immediate pass", sp, out)
			}
		case Everyone:
			if out.Done || !out.Known || out.Draw != 0 {
				t.Errorf("%s: %+v, want a request for every known peer", sp, out)
			}
		case Sampled:
			if out.Done || out.Known || out.Draw != 2 {
				t.Errorf("%s: %+v, want a draw of 2", sp, out)
			}
		}
		if (c.Pace() != nil) != k.Pace {
			t.Errorf("%s: pace rule %v, want %v", sp, c.Pace() != nil, k.Pace)
		}
	}
}

func ExampleKindsHelp() {
	fmt.Println(KindsHelp("  "))
	// Output:
	//   asp            asynchronous: always passes
	//   bsp            bulk synchronous: passes when every node has step ≥ c
	//   ssp:S          stale synchronous: passes when every node has step ≥ c − S
	//   pbsp:B         probabilistic BSP: passes when B peers drawn uniformly without replacement all have step ≥ c
	//   pssp:B:S       probabilistic SSP: passes when B sampled peers all have step ≥ c − S
	//   dssp:SL:SU     dynamic SSP: passes within SL steps of the slowest node, or when granted extra steps up to SU
	//   pdssp:B:SL:SU  decentralised dynamic SSP: as dssp, over a sample of B peers
	//   (c = the node's step; B = sample size β, or auto: a third of the other nodes, 1 to 10; S = staleness, SL..SU = DSSP staleness range)
}
