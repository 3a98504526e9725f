package psp

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Step counts the iterations a node has completed.
type Step = int64

// Limits on spec parameters. They are far beyond any useful value and keep
// arithmetic on steps free of overflow.
const (
	MaxBeta      = 1 << 20
	MaxStaleness = 1 << 30
)

// Spec is a parsed barrier specification.
//
// Beta is the sample size β of the probabilistic kinds (PBSP, PSSP, PDSSP).
// Staleness is s for SSP and PSSP, and S_L for DSSP and PDSSP. Upper is S_U
// for DSSP and PDSSP. Which fields a kind uses are its Params in the kinds
// table (Kind.Info); fields it does not use are zero.
//
// Auto (written "auto" in place of β: "pssp:auto:4") sizes the sample to
// the job: a third of the other nodes, at least 1 and at most Beta
// (AutoBetaCap, 10): see BetaFor. A sampled barrier whose β reaches the
// job's size is the global one (β ≥ N − 1 is SSP), and a job of a few
// machines then runs at the pace of its slowest; a third keeps a slow
// machine out of two checks in three, while a large job samples the PSP
// paper's 10.
type Spec struct {
	Kind      Kind
	Beta      int
	Staleness int
	Upper     int
	Auto      bool
}

// AutoBetaCap is the largest β an auto spec draws.
const AutoBetaCap = 10

// ErrSpec is wrapped by every error Parse returns.
var ErrSpec = errors.New("invalid barrier spec")

// Parse parses a barrier spec such as "pssp:10:4". It is strict: names are
// lower case, numbers are plain decimal without sign or leading zeros, and
// for every spec it accepts, Parse(s).String() == s.
func Parse(s string) (Spec, error) {
	fail := func(format string, a ...any) (Spec, error) {
		return Spec{}, fmt.Errorf("%w %q: %s (grammar: %s)", ErrSpec, s, fmt.Sprintf(format, a...), Grammar)
	}
	if s == "" {
		return fail("empty")
	}
	parts := strings.Split(s, ":")
	name, args := parts[0], parts[1:]
	var info KindInfo
	for _, k := range kinds {
		if k.Name == name {
			info = k
		}
	}
	if info.Kind == 0 {
		for _, k := range kinds {
			if strings.EqualFold(k.Name, strings.TrimSpace(name)) {
				return fail("unknown barrier %q (did you mean %q?)", name, k.Name)
			}
		}
		return fail("unknown barrier %q", name)
	}
	if len(args) != len(info.Params) {
		return fail("%s takes %d parameter(s), got %d: write %s", name, len(info.Params), len(args), info.Form())
	}
	sp := Spec{Kind: info.Kind}
	for i, a := range args {
		p := info.Params[i]
		if p.Field == FieldBeta && a == "auto" {
			sp.Beta, sp.Auto = AutoBetaCap, true
			continue
		}
		limit := MaxStaleness
		if p.Field == FieldBeta {
			limit = MaxBeta
		}
		v, err := parseNat(a, limit)
		if err != nil {
			return fail("parameter %s: %v", p.Name, err)
		}
		*sp.field(p.Field) = v
	}
	if err := sp.Validate(); err != nil {
		return fail("%s", strings.TrimPrefix(err.Error(), ErrSpec.Error()+": "))
	}
	return sp, nil
}

// MustParse is Parse for specs known to be valid (tests, examples, defaults).
// It panics on an invalid spec.
func MustParse(s string) Spec {
	sp, err := Parse(s)
	if err != nil {
		panic(err)
	}
	return sp
}

func parseNat(a string, limit int) (int, error) {
	if a == "" {
		return 0, errors.New("missing number")
	}
	for _, r := range a {
		if r < '0' || r > '9' {
			return 0, fmt.Errorf("%q is not a non-negative decimal integer", a)
		}
	}
	if len(a) > 1 && a[0] == '0' {
		return 0, fmt.Errorf("%q has a leading zero", a)
	}
	v, err := strconv.Atoi(a)
	if err != nil || v > limit {
		return 0, fmt.Errorf("%q is larger than %d", a, limit)
	}
	return v, nil
}

// Validate checks the fields against the kind. Parse only returns valid specs;
// Validate is for specs built in code.
func (s Spec) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrSpec, fmt.Sprintf(format, a...))
	}
	info := s.Kind.info()
	if info.Kind == 0 {
		return bad("unknown kind %d", s.Kind)
	}
	if s.Beta < 0 || s.Beta > MaxBeta {
		return bad("sample size %d out of range [0, %d]", s.Beta, MaxBeta)
	}
	if s.Staleness < 0 || s.Staleness > MaxStaleness || s.Upper < 0 || s.Upper > MaxStaleness {
		return bad("staleness out of range [0, %d]", MaxStaleness)
	}
	for _, f := range []Field{FieldBeta, FieldStaleness, FieldUpper} {
		if !info.Takes(f) && *s.field(f) != 0 {
			return bad("%s does not take the parameters set in %+v", s.Kind, s)
		}
	}
	if info.Takes(FieldUpper) && s.Upper < s.Staleness {
		return bad("S_L=%d is above S_U=%d", s.Staleness, s.Upper)
	}
	if s.Auto && (!info.Takes(FieldBeta) || s.Beta != AutoBetaCap) {
		return bad("an auto sample size is for %s, with Beta %d", KindList("and", takesBeta), AutoBetaCap)
	}
	return nil
}

// BetaFor is the sample size for a job of population nodes (this one
// included): Beta, or for an auto spec a third of the others, at least 1
// and at most Beta.
func (s Spec) BetaFor(population float64) int {
	if !s.Auto {
		return s.Beta
	}
	others := int(population+0.5) - 1
	return min(s.Beta, max(1, others/3))
}

// betaText is β as a spec writes it.
func (s Spec) betaText() string {
	if s.Auto {
		return "auto"
	}
	return strconv.Itoa(s.Beta)
}

// String returns the canonical spec ("pssp:10:4").
func (s Spec) String() string {
	info := s.Kind.info()
	if info.Kind == 0 {
		return s.Kind.String()
	}
	out := info.Name
	for _, p := range info.Params {
		if p.Field == FieldBeta {
			out += ":" + s.betaText()
			continue
		}
		out += ":" + strconv.Itoa(*s.field(p.Field))
	}
	return out
}

// field is the Spec field f.
func (s *Spec) field(f Field) *int {
	switch f {
	case FieldBeta:
		return &s.Beta
	case FieldStaleness:
		return &s.Staleness
	case FieldUpper:
		return &s.Upper
	}
	panic(fmt.Sprintf("psp: no Spec field %d", f))
}

// takesBeta keeps the kinds with a sample size (KindList).
func takesBeta(k KindInfo) bool { return k.Takes(FieldBeta) }

// MarshalText makes a Spec print as its canonical string in JSON and flags.
func (s Spec) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText parses a spec, strictly.
func (s *Spec) UnmarshalText(b []byte) error {
	sp, err := Parse(string(b))
	if err != nil {
		return err
	}
	*s = sp
	return nil
}

// Scope is which peers the barrier's check asks (its kind's Scope; 0 for
// an invalid kind).
func (s Spec) Scope() Scope { return s.Kind.info().Scope }

// Probabilistic reports whether the barrier decides on a sample of β peers
// (pBSP, pSSP, pDSSP) rather than on every node.
func (s Spec) Probabilistic() bool { return s.Scope() == Sampled }

// Global reports whether the barrier needs every node's step (BSP, SSP,
// DSSP). In a real network that means every peer the node knows; testnets
// and the simulator may offer an oracle of true global state as a baseline.
func (s Spec) Global() bool { return s.Scope() == Everyone }

// Dynamic reports whether the staleness varies at run time (DSSP, pDSSP).
func (s Spec) Dynamic() bool { return s.Kind.info().Dynamic }

// SampleSize returns how many of the other nodes a node must observe to
// decide: 0 for ASP, all of them for the global barriers, and min(β, others)
// for the probabilistic ones (β as BetaFor a job of others + 1).
func (s Spec) SampleSize(others int) int {
	if others < 0 {
		others = 0
	}
	switch s.Scope() {
	case NoCheck:
		return 0
	case Everyone:
		return others
	}
	return min(s.BetaFor(float64(others+1)), others)
}

// BaseStaleness is the staleness the barrier applies before any dynamic
// allowance: its Staleness (s, or S_L) if its kind takes one, else 0 (BSP,
// pBSP), and -1 (no bound) for a kind that never checks (ASP).
func (s Spec) BaseStaleness() int {
	info := s.Kind.info()
	switch {
	case info.Scope == NoCheck:
		return -1
	case info.Takes(FieldStaleness):
		return s.Staleness
	}
	return 0
}
