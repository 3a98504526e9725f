package psp

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Step counts the iterations a node has completed.
type Step = int64

// Kind names a barrier family.
type Kind uint8

// The barrier kinds. The zero Kind is invalid, so an unset Spec is caught.
const (
	ASP   Kind = iota + 1 // asynchronous: never wait
	BSP                   // bulk synchronous: every node has step >= c
	SSP                   // stale synchronous: every node has step >= c-s
	PBSP                  // probabilistic BSP: β sampled nodes have step >= c
	PSSP                  // probabilistic SSP: β sampled nodes have step >= c-s
	DSSP                  // dynamic SSP: staleness within [S_L, S_U], global view
	PDSSP                 // decentralised dynamic SSP over a sample of β peers
)

var kindNames = map[Kind]string{
	ASP: "asp", BSP: "bsp", SSP: "ssp", PBSP: "pbsp", PSSP: "pssp", DSSP: "dssp", PDSSP: "pdssp",
}

// String returns the kind's name as used in specs ("pssp").
func (k Kind) String() string {
	if n, ok := kindNames[k]; ok {
		return n
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

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
// for DSSP and PDSSP. Fields a kind does not use are zero.
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

// Grammar is the barrier spec grammar, for help texts.
const Grammar = "asp | bsp | ssp:S | pbsp:B | pssp:B:S | dssp:SL:SU | pdssp:B:SL:SU " +
	"(B = sample size β, or auto: a third of the other nodes, 1 to 10; S = staleness, SL..SU = DSSP staleness range)"

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
	var kind Kind
	for k, n := range kindNames {
		if n == name {
			kind = k
		}
	}
	if kind == 0 {
		for k, n := range kindNames {
			if strings.EqualFold(n, strings.TrimSpace(name)) {
				return fail("unknown barrier %q (did you mean %q?)", name, k.String())
			}
		}
		return fail("unknown barrier %q", name)
	}
	want := map[Kind][]string{
		ASP: nil, BSP: nil, SSP: {"S"}, PBSP: {"B"}, PSSP: {"B", "S"},
		DSSP: {"SL", "SU"}, PDSSP: {"B", "SL", "SU"},
	}[kind]
	if len(args) != len(want) {
		form := name
		for _, w := range want {
			form += ":" + w
		}
		return fail("%s takes %d parameter(s), got %d: write %s", name, len(want), len(args), form)
	}
	vals := make([]int, len(args))
	auto := false
	for i, a := range args {
		limit := MaxStaleness
		if want[i] == "B" {
			limit = MaxBeta
			if a == "auto" {
				vals[i], auto = AutoBetaCap, true
				continue
			}
		}
		v, err := parseNat(a, limit)
		if err != nil {
			return fail("parameter %s: %v", want[i], err)
		}
		vals[i] = v
	}
	sp := Spec{Kind: kind, Auto: auto}
	switch kind {
	case SSP:
		sp.Staleness = vals[0]
	case PBSP:
		sp.Beta = vals[0]
	case PSSP:
		sp.Beta, sp.Staleness = vals[0], vals[1]
	case DSSP:
		sp.Staleness, sp.Upper = vals[0], vals[1]
	case PDSSP:
		sp.Beta, sp.Staleness, sp.Upper = vals[0], vals[1], vals[2]
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
	if _, ok := kindNames[s.Kind]; !ok {
		return bad("unknown kind %d", s.Kind)
	}
	if s.Beta < 0 || s.Beta > MaxBeta {
		return bad("sample size %d out of range [0, %d]", s.Beta, MaxBeta)
	}
	if s.Staleness < 0 || s.Staleness > MaxStaleness || s.Upper < 0 || s.Upper > MaxStaleness {
		return bad("staleness out of range [0, %d]", MaxStaleness)
	}
	uses := map[Kind][3]bool{ // beta, staleness, upper
		ASP: {}, BSP: {}, SSP: {false, true, false}, PBSP: {true, false, false},
		PSSP: {true, true, false}, DSSP: {false, true, true}, PDSSP: {true, true, true},
	}[s.Kind]
	if (!uses[0] && s.Beta != 0) || (!uses[1] && s.Staleness != 0) || (!uses[2] && s.Upper != 0) {
		return bad("%s does not take the parameters set in %+v", s.Kind, s)
	}
	if uses[2] && s.Upper < s.Staleness {
		return bad("S_L=%d is above S_U=%d", s.Staleness, s.Upper)
	}
	if s.Auto && (!uses[0] || s.Beta != AutoBetaCap) {
		return bad("an auto sample size is for pbsp, pssp and pdssp, with Beta %d", AutoBetaCap)
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
	switch s.Kind {
	case SSP:
		return fmt.Sprintf("ssp:%d", s.Staleness)
	case PBSP:
		return fmt.Sprintf("pbsp:%s", s.betaText())
	case PSSP:
		return fmt.Sprintf("pssp:%s:%d", s.betaText(), s.Staleness)
	case DSSP:
		return fmt.Sprintf("dssp:%d:%d", s.Staleness, s.Upper)
	case PDSSP:
		return fmt.Sprintf("pdssp:%s:%d:%d", s.betaText(), s.Staleness, s.Upper)
	}
	return s.Kind.String()
}

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

// Probabilistic reports whether the barrier decides on a sample of β peers
// (pBSP, pSSP, pDSSP) rather than on every node.
func (s Spec) Probabilistic() bool { return s.Kind == PBSP || s.Kind == PSSP || s.Kind == PDSSP }

// Global reports whether the barrier needs every node's step (BSP, SSP,
// DSSP). In a real network that means every peer the node knows; testnets
// and the simulator may offer an oracle of true global state as a baseline.
func (s Spec) Global() bool { return s.Kind == BSP || s.Kind == SSP || s.Kind == DSSP }

// Dynamic reports whether the staleness varies at run time (DSSP, pDSSP).
func (s Spec) Dynamic() bool { return s.Kind == DSSP || s.Kind == PDSSP }

// SampleSize returns how many of the other nodes a node must observe to
// decide: 0 for ASP, all of them for the global barriers, and min(β, others)
// for the probabilistic ones (β as BetaFor a job of others + 1).
func (s Spec) SampleSize(others int) int {
	if others < 0 {
		others = 0
	}
	switch {
	case s.Kind == ASP:
		return 0
	case s.Global():
		return others
	default:
		return min(s.BetaFor(float64(others+1)), others)
	}
}

// BaseStaleness is the staleness the barrier applies before any dynamic
// allowance: 0 for BSP and pBSP, s for SSP and pSSP, S_L for DSSP and pDSSP,
// and -1 (no bound) for ASP.
func (s Spec) BaseStaleness() int {
	switch s.Kind {
	case ASP:
		return -1
	case SSP, PSSP, DSSP, PDSSP:
		return s.Staleness
	}
	return 0
}
