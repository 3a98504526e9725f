package psp

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
)

func TestParseValid(t *testing.T) {
	tests := []struct {
		in   string
		want Spec
	}{
		{"asp", Spec{Kind: ASP}},
		{"bsp", Spec{Kind: BSP}},
		{"ssp:0", Spec{Kind: SSP}},
		{"ssp:4", Spec{Kind: SSP, Staleness: 4}},
		{"ssp:1073741824", Spec{Kind: SSP, Staleness: MaxStaleness}},
		{"pbsp:0", Spec{Kind: PBSP}},
		{"pbsp:10", Spec{Kind: PBSP, Beta: 10}},
		{"pbsp:1048576", Spec{Kind: PBSP, Beta: MaxBeta}},
		{"pssp:10:4", Spec{Kind: PSSP, Beta: 10, Staleness: 4}},
		{"pssp:0:0", Spec{Kind: PSSP}},
		{"dssp:1:4", Spec{Kind: DSSP, Staleness: 1, Upper: 4}},
		{"dssp:3:3", Spec{Kind: DSSP, Staleness: 3, Upper: 3}},
		{"dssp:0:0", Spec{Kind: DSSP}},
		{"pdssp:8:2:6", Spec{Kind: PDSSP, Beta: 8, Staleness: 2, Upper: 6}},
		{"pdssp:0:0:1073741824", Spec{Kind: PDSSP, Upper: MaxStaleness}},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := Parse(tt.in)
			if err != nil {
				t.Fatalf("Parse(%q): %v", tt.in, err)
			}
			if got != tt.want {
				t.Errorf("Parse(%q) = %+v, want %+v", tt.in, got, tt.want)
			}
			if s := got.String(); s != tt.in {
				t.Errorf("Parse(%q).String() = %q", tt.in, s)
			}
			if err := got.Validate(); err != nil {
				t.Errorf("Validate: %v", err)
			}
			if MustParse(tt.in) != got {
				t.Errorf("MustParse differs from Parse")
			}
		})
	}
}

func TestParseInvalid(t *testing.T) {
	tests := []struct {
		in string
		// every fragment must appear in the error message
		want []string
	}{
		{"", []string{"empty"}},
		{"foo", []string{`unknown barrier "foo"`}},
		{"BSP", []string{`did you mean "bsp"`}},
		{"Pssp:10:4", []string{`did you mean "pssp"`}},
		{" asp", []string{`did you mean "asp"`}},
		{"asp ", []string{`did you mean "asp"`}},
		{"ssp", []string{"takes 1 parameter(s), got 0", "write ssp:S"}},
		{"asp:1", []string{"takes 0 parameter(s), got 1", "write asp"}},
		{"bsp:", []string{"takes 0 parameter(s), got 1"}},
		{"pssp:10", []string{"takes 2 parameter(s), got 1", "write pssp:B:S"}},
		{"pssp:1:2:3", []string{"takes 2 parameter(s), got 3"}},
		{"dssp:1", []string{"write dssp:SL:SU"}},
		{"pdssp:1:2", []string{"write pdssp:B:SL:SU"}},
		{"ssp:", []string{"parameter S", "missing number"}},
		{"pssp::4", []string{"parameter B", "missing number"}},
		{"pssp:10:", []string{"parameter S", "missing number"}},
		{"ssp:4:", []string{"takes 1 parameter(s), got 2"}},
		{"ssp:-1", []string{"parameter S", `"-1" is not a non-negative decimal integer`}},
		{"pbsp:+4", []string{"parameter B", `"+4" is not a non-negative decimal integer`}},
		{"ssp:04", []string{`"04" has a leading zero`}},
		{"pbsp:00", []string{"leading zero"}},
		{"ssp:4.0", []string{"not a non-negative decimal integer"}},
		{"ssp:0x10", []string{"not a non-negative decimal integer"}},
		{"ssp:1e3", []string{"not a non-negative decimal integer"}},
		{"ssp:٤", []string{"not a non-negative decimal integer"}}, // Arabic-Indic four
		{"ssp: 4", []string{"not a non-negative decimal integer"}},
		{"ssp:4 ", []string{"not a non-negative decimal integer"}},
		{"ssp:1073741825", []string{"larger than 1073741824"}},
		{"pbsp:1048577", []string{"parameter B", "larger than 1048576"}},
		{"pssp:1048577:1", []string{"parameter B", "larger than"}},
		{"ssp:99999999999999999999999", []string{"larger than"}},
		{"dssp:5:3", []string{"S_L=5 is above S_U=3"}},
		{"pdssp:4:2:1", []string{"S_L=2 is above S_U=1"}},
		{":", []string{`unknown barrier ""`}},
		{"ssp::", []string{"takes 1 parameter(s), got 2"}},
		{"asp\n", []string{`did you mean "asp"`}},
		{"ssp\x00:1", []string{"unknown barrier"}},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			sp, err := Parse(tt.in)
			if err == nil {
				t.Fatalf("Parse(%q) = %+v, want an error", tt.in, sp)
			}
			if !errors.Is(err, ErrSpec) {
				t.Errorf("Parse(%q): %v does not wrap ErrSpec", tt.in, err)
			}
			if sp != (Spec{}) {
				t.Errorf("Parse(%q) returned %+v with its error, want the zero Spec", tt.in, sp)
			}
			msg := err.Error()
			// Every message quotes the input and shows the grammar.
			for _, frag := range append([]string{strconv.Quote(tt.in), Grammar}, tt.want...) {
				if !strings.Contains(msg, frag) {
					t.Errorf("Parse(%q) error %q lacks %q", tt.in, msg, frag)
				}
			}
			// ... and names the problem once, not "invalid barrier spec" twice.
			if n := strings.Count(msg, ErrSpec.Error()); n != 1 {
				t.Errorf("Parse(%q) error %q repeats %q %d times", tt.in, msg, ErrSpec.Error(), n)
			}
		})
	}
}

func TestMustParsePanics(t *testing.T) {
	defer func() {
		r := recover()
		err, ok := r.(error)
		if !ok || !errors.Is(err, ErrSpec) {
			t.Errorf("MustParse(\"nope\") panicked with %v, want an ErrSpec error", r)
		}
	}()
	MustParse("nope")
}

func TestValidate(t *testing.T) {
	tests := []struct {
		sp   Spec
		ok   bool
		frag string
	}{
		{Spec{Kind: ASP}, true, ""},
		{Spec{Kind: PDSSP, Beta: 3, Staleness: 1, Upper: 2}, true, ""},
		{Spec{Kind: DSSP, Staleness: 2, Upper: 2}, true, ""},
		{Spec{}, false, "unknown kind 0"},
		{Spec{Kind: PDSSP + 1}, false, "unknown kind"},
		{Spec{Kind: ASP, Beta: 1}, false, "asp does not take"},
		{Spec{Kind: BSP, Staleness: 2}, false, "bsp does not take"},
		{Spec{Kind: SSP, Staleness: 2, Beta: 1}, false, "ssp does not take"},
		{Spec{Kind: SSP, Staleness: 2, Upper: 3}, false, "ssp does not take"},
		{Spec{Kind: PBSP, Beta: 2, Staleness: 1}, false, "pbsp does not take"},
		{Spec{Kind: PSSP, Beta: 2, Staleness: 1, Upper: 5}, false, "pssp does not take"},
		{Spec{Kind: DSSP, Beta: 2, Staleness: 1, Upper: 5}, false, "dssp does not take"},
		{Spec{Kind: PBSP, Beta: -1}, false, "sample size -1 out of range"},
		{Spec{Kind: PBSP, Beta: MaxBeta + 1}, false, "out of range"},
		{Spec{Kind: SSP, Staleness: -1}, false, "staleness out of range"},
		{Spec{Kind: SSP, Staleness: MaxStaleness + 1}, false, "staleness out of range"},
		{Spec{Kind: DSSP, Staleness: 0, Upper: -1}, false, "staleness out of range"},
		{Spec{Kind: DSSP, Staleness: 3, Upper: 2}, false, "S_L=3 is above S_U=2"},
		{Spec{Kind: PDSSP, Beta: 1, Staleness: 3}, false, "S_L=3 is above S_U=0"},
	}
	for _, tt := range tests {
		err := tt.sp.Validate()
		if tt.ok {
			if err != nil {
				t.Errorf("%+v: Validate = %v, want nil", tt.sp, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("%+v: Validate = nil, want an error", tt.sp)
			continue
		}
		if !errors.Is(err, ErrSpec) || !strings.Contains(err.Error(), tt.frag) {
			t.Errorf("%+v: Validate = %q, want ErrSpec and %q", tt.sp, err, tt.frag)
		}
	}
}

func TestSpecTextAndJSON(t *testing.T) {
	type cfg struct {
		Barrier Spec   `json:"barrier"`
		Others  []Spec `json:"others"`
	}
	in := cfg{Barrier: MustParse("pssp:10:4"), Others: []Spec{MustParse("asp"), MustParse("pdssp:5:1:3")}}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"barrier":"pssp:10:4","others":["asp","pdssp:5:1:3"]}`
	if string(b) != want {
		t.Errorf("json = %s, want %s", b, want)
	}
	var out cfg
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	if out.Barrier != in.Barrier || len(out.Others) != 2 || out.Others[0] != in.Others[0] || out.Others[1] != in.Others[1] {
		t.Errorf("round trip: %+v, want %+v", out, in)
	}
	for _, bad := range []string{`{"barrier":"PSSP:10:4"}`, `{"barrier":"pssp:10"}`, `{"barrier":""}`} {
		var c cfg
		err := json.Unmarshal([]byte(bad), &c)
		if err == nil || !errors.Is(err, ErrSpec) {
			t.Errorf("Unmarshal(%s) = %v, want an ErrSpec error", bad, err)
		}
	}
	sp := MustParse("ssp:3")
	if err := sp.UnmarshalText([]byte("ssp:x")); err == nil || sp != MustParse("ssp:3") {
		t.Errorf("UnmarshalText of a bad spec: err=%v, spec changed to %+v", err, sp)
	}
	text, _ := MustParse("dssp:1:4").MarshalText()
	if string(text) != "dssp:1:4" {
		t.Errorf("MarshalText = %q", text)
	}
}

func TestKindAndPredicates(t *testing.T) {
	tests := []struct {
		spec                           string
		name                           string
		probabilistic, global, dynamic bool
		base                           int
	}{
		{"asp", "asp", false, false, false, -1},
		{"bsp", "bsp", false, true, false, 0},
		{"ssp:4", "ssp", false, true, false, 4},
		{"pbsp:10", "pbsp", true, false, false, 0},
		{"pssp:10:4", "pssp", true, false, false, 4},
		{"dssp:2:5", "dssp", false, true, true, 2},
		{"pdssp:10:2:5", "pdssp", true, false, true, 2},
	}
	for _, tt := range tests {
		sp := MustParse(tt.spec)
		if sp.Kind.String() != tt.name || sp.Probabilistic() != tt.probabilistic ||
			sp.Global() != tt.global || sp.Dynamic() != tt.dynamic || sp.BaseStaleness() != tt.base {
			t.Errorf("%s: kind %q probabilistic %v global %v dynamic %v base %d", tt.spec,
				sp.Kind, sp.Probabilistic(), sp.Global(), sp.Dynamic(), sp.BaseStaleness())
		}
	}
	if got := Kind(0).String(); got != "kind(0)" {
		t.Errorf("Kind(0).String() = %q", got)
	}
	if got := Kind(200).String(); got != "kind(200)" {
		t.Errorf("Kind(200).String() = %q", got)
	}
}

func TestSampleSize(t *testing.T) {
	tests := []struct {
		spec   string
		others int
		want   int
	}{
		{"asp", 100, 0},
		{"asp", 0, 0},
		{"bsp", 100, 100},
		{"bsp", 0, 0},
		{"ssp:3", 57, 57},
		{"dssp:1:3", 57, 57},
		{"pbsp:10", 100, 10},
		{"pbsp:10", 10, 10},
		{"pbsp:10", 9, 9},
		{"pbsp:10", 0, 0},
		{"pbsp:0", 100, 0},
		{"pssp:10:4", 3, 3},
		{"pssp:10:4", 1000, 10},
		{"pdssp:7:1:3", 1000, 7},
		{"pdssp:7:1:3", 2, 2},
		{"bsp", -5, 0},
		{"pbsp:10", -5, 0},
	}
	for _, tt := range tests {
		if got := MustParse(tt.spec).SampleSize(tt.others); got != tt.want {
			t.Errorf("%s.SampleSize(%d) = %d, want %d", tt.spec, tt.others, got, tt.want)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"asp", "bsp", "ssp:4", "pbsp:10", "pssp:10:4", "dssp:1:4", "pdssp:10:1:4",
		"ssp:0", "pbsp:1048576", "ssp:1073741824", "pdssp:0:0:0",
		"", ":", "BSP", "ssp", "ssp:", "ssp:04", "ssp:+4", "ssp:-4", "pssp:10:4:", "dssp:5:3",
		"ssp:99999999999999999999", "ssp:1073741825", " pbsp:3", "pssp::", "ssp:٤", "ssp:4\x00",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sp, err := Parse(s)
		if err != nil {
			if !errors.Is(err, ErrSpec) {
				t.Fatalf("Parse(%q): error %v does not wrap ErrSpec", s, err)
			}
			if sp != (Spec{}) {
				t.Fatalf("Parse(%q) returned %+v with an error", s, sp)
			}
			return
		}
		if got := sp.String(); got != s {
			t.Fatalf("Parse(%q).String() = %q", s, got)
		}
		if err := sp.Validate(); err != nil {
			t.Fatalf("Parse(%q) = %+v, which does not validate: %v", s, sp, err)
		}
		again, err := Parse(sp.String())
		if err != nil || again != sp {
			t.Fatalf("Parse(%q) = %+v, reparse = %+v, %v", s, sp, again, err)
		}
		text, _ := sp.MarshalText()
		var back Spec
		if err := back.UnmarshalText(text); err != nil || back != sp {
			t.Fatalf("text round trip of %+v: %+v, %v", sp, back, err)
		}
		if sp.SampleSize(5) < 0 || sp.SampleSize(5) > 5 {
			t.Fatalf("%v.SampleSize(5) = %d", sp, sp.SampleSize(5))
		}
	})
}

func TestAutoBeta(t *testing.T) {
	for _, s := range []string{"pssp:auto:4", "pbsp:auto", "pdssp:auto:2:6"} {
		sp, err := Parse(s)
		if err != nil || !sp.Auto || sp.Beta != AutoBetaCap || sp.String() != s {
			t.Errorf("Parse(%q) = %+v, %v (prints %q)", s, sp, err, sp.String())
		}
	}
	for _, s := range []string{"ssp:auto", "dssp:auto:2", "pssp:4:auto", "pssp:Auto:4"} {
		if _, err := Parse(s); err == nil {
			t.Errorf("Parse(%q) accepted", s)
		}
	}
	if err := (Spec{Kind: SSP, Staleness: 4, Auto: true}).Validate(); err == nil {
		t.Error("an auto SSP validated")
	}
	sp := MustParse("pssp:auto:4")
	for _, tc := range []struct {
		population float64
		beta, of   int
	}{
		{0, 1, 0}, {1, 1, 0}, {2, 1, 1}, {4, 1, 1}, {7, 2, 2}, {10, 3, 3}, {31, 10, 10}, {200, 10, 10}, {1e6, 10, 10},
	} {
		if got := sp.BetaFor(tc.population); got != tc.beta {
			t.Errorf("BetaFor(%v) = %d, want %d", tc.population, got, tc.beta)
		}
		if others := max(0, int(tc.population)-1); sp.SampleSize(others) != tc.of {
			t.Errorf("SampleSize(%d) = %d, want %d", others, sp.SampleSize(others), tc.of)
		}
	}
	if fixed := MustParse("pssp:10:4"); fixed.BetaFor(4) != 10 || fixed.SampleSize(3) != 3 {
		t.Error("a fixed β changed with the population")
	}
}
