package psp

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
)

var updateGolden = flag.Bool("update", false, "rewrite testdata/*.golden from the current code")

// The golden files record what Parse, String, Validate and the kind
// predicates answered for a systematic corpus of spec strings and of specs
// built in code, as the code before the kinds table answered. The table
// must not change what a user sees: every line must still match.
//
// Regenerate (only for an intended change of behaviour) with
//
//	go test ./psp/ -run Golden -update

// goldenSpecStrings is every spec string the golden file covers: each kind
// name and a few near misses, with 0 to 4 parameters drawn from values that
// are valid, out of range, malformed, or "auto".
func goldenSpecStrings() []string {
	names := []string{"asp", "bsp", "ssp", "pbsp", "pssp", "dssp", "pdssp"}
	odd := []string{"", "foo", "BSP", "Pssp", " asp", "asp ", "asp\n", "ssp\x00", "PDSSP", "auto", "sp", "kind(0)", "Ssp"}
	v2 := []string{"0", "4", "auto", "", "-1", "04", "1048577", "1073741825", "x"}
	v3 := []string{"0", "2", "auto", "", "1073741825"}
	v4 := []string{"1", "auto"}
	var out []string
	var rec func(prefix string, left int, vals []string)
	rec = func(prefix string, left int, vals []string) {
		if left == 0 {
			out = append(out, prefix)
			return
		}
		for _, v := range vals {
			rec(prefix+":"+v, left-1, vals)
		}
	}
	for _, n := range names {
		out = append(out, n)
		rec(n, 1, v2)
		rec(n, 2, v2)
		rec(n, 3, v3)
		rec(n, 4, v4)
	}
	for _, n := range odd {
		out = append(out, n)
		rec(n, 1, []string{"4", "auto"})
		rec(n, 2, []string{"4"})
	}
	out = append(out, ":", "::", "ssp:4.0", "ssp:0x10", "ssp:1e3", "ssp:٤", "ssp: 4", "ssp:4 ",
		"ssp:99999999999999999999999", "pbsp:1048576", "ssp:1073741824", "pbsp:+4", "pbsp:00",
		"pssp:Auto:4", "pssp:auto:auto", "pdssp:auto:3:2", "pdssp:1048576:1073741824:1073741824")
	return out
}

// goldenSpecs is every Spec built in code the golden file covers.
func goldenSpecs() []Spec {
	var out []Spec
	for k := Kind(0); k <= PDSSP+2; k++ {
		for _, b := range []int{-1, 0, 10, MaxBeta + 1} {
			for _, s := range []int{-1, 0, 2, MaxStaleness + 1} {
				for _, u := range []int{0, 1, 3} {
					for _, a := range []bool{false, true} {
						out = append(out, Spec{Kind: k, Beta: b, Staleness: s, Upper: u, Auto: a})
					}
				}
			}
		}
	}
	return out
}

// describeSpec is everything the rest of the code reads of a valid spec.
func describeSpec(sp Spec) string {
	text, _ := sp.MarshalText()
	var b strings.Builder
	fmt.Fprintf(&b, "%+v str=%q text=%q kind=%s prob=%v global=%v dyn=%v base=%d",
		sp, sp.String(), text, sp.Kind, sp.Probabilistic(), sp.Global(), sp.Dynamic(), sp.BaseStaleness())
	for _, o := range []int{-1, 0, 3, 40} {
		fmt.Fprintf(&b, " ss(%d)=%d", o, sp.SampleSize(o))
	}
	for _, p := range []float64{0, 4, 31, 100} {
		fmt.Fprintf(&b, " beta(%v)=%d", p, sp.BetaFor(p))
	}
	fmt.Fprintf(&b, " iso=%v,%v,%v,%v",
		Isolated(sp, 0, 0, 0, true), Isolated(sp, 2, 0, 0, false), Isolated(sp, 0, 0, 1, true), Isolated(sp, 2, 1, 1, true))
	d := NewDecider(sp)
	obs := []Observation{{Peer: "a", Step: 10}, {Peer: "b", Step: 8}, {Peer: "c", Step: 5}}
	fmt.Fprintf(&b, " decider=%T %+v", d, d.Decide(10, 0, obs))
	paced := NewChecker(CheckConfig{Spec: sp, Pace: DefaultPaceConfig(), Timing: DefaultTimingConfig()}, nil).Pace() != nil
	fmt.Fprintf(&b, " pace=%v", paced)
	return b.String()
}

// goldenLines computes the golden file's lines with the current code.
func goldenLines(t *testing.T) []string {
	t.Helper()
	var lines []string
	lines = append(lines, "grammar "+strconv.Quote(Grammar))
	for k := Kind(0); k <= PDSSP+2; k++ {
		lines = append(lines, fmt.Sprintf("kind %d %s", k, k))
	}
	for _, s := range goldenSpecStrings() {
		sp, err := Parse(s)
		if err != nil {
			msg := err.Error()
			prefix := fmt.Sprintf("%s %q: ", ErrSpec, s)
			suffix := fmt.Sprintf(" (grammar: %s)", Grammar)
			if !strings.HasPrefix(msg, prefix) || !strings.HasSuffix(msg, suffix) || sp != (Spec{}) {
				t.Errorf("Parse(%q) = %+v, %q: want the zero Spec and an error %q...%q", s, sp, msg, prefix, suffix)
			}
			msg = strings.TrimSuffix(strings.TrimPrefix(msg, prefix), suffix)
			lines = append(lines, fmt.Sprintf("parse %q refused %q", s, msg))
			continue
		}
		lines = append(lines, fmt.Sprintf("parse %q %s", s, describeSpec(sp)))
	}
	for _, sp := range goldenSpecs() {
		if err := sp.Validate(); err != nil {
			lines = append(lines, fmt.Sprintf("spec %+v/%v str=%q invalid %q", sp, uint8(sp.Kind), sp.String(), err))
			continue
		}
		lines = append(lines, fmt.Sprintf("spec %+v valid %s", sp, describeSpec(sp)))
	}
	return lines
}

// TestSpecGolden compares Parse, String, Validate and the predicates with
// what the code answered before the kinds table, line by line.
func TestSpecGolden(t *testing.T) {
	const path = "testdata/spec.golden"
	got := goldenLines(t)
	if *updateGolden {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(strings.Join(got, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var want []string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		want = append(want, sc.Text())
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Errorf("%d lines, golden file has %d", len(got), len(want))
	}
	bad := 0
	for i := range min(len(got), len(want)) {
		if got[i] != want[i] {
			if bad++; bad <= 20 {
				t.Errorf("line %d:\n got %s\nwant %s", i+1, got[i], want[i])
			}
		}
	}
	if bad > 20 {
		t.Errorf("... and %d more lines differ", bad-20)
	}
}
