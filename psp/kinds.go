package psp

import (
	"fmt"
	"slices"
	"strings"
)

// Kind names a barrier family. Its meaning is its entry in the kinds
// table (Kind.Info).
type Kind uint8

// The barrier kinds, in the order of the kinds table. The zero Kind is
// invalid, so an unset Spec is caught.
const (
	ASP   Kind = iota + 1 // asynchronous: never wait
	BSP                   // bulk synchronous: every node has step >= c
	SSP                   // stale synchronous: every node has step >= c-s
	PBSP                  // probabilistic BSP: β sampled nodes have step >= c
	PSSP                  // probabilistic SSP: β sampled nodes have step >= c-s
	DSSP                  // dynamic SSP: staleness within [S_L, S_U], global view
	PDSSP                 // decentralised dynamic SSP over a sample of β peers
)

// kinds is the kinds table: one entry per Kind, in the order of the
// constants above (kinds[k-1] is Kind k). Everything that depends on the
// kind reads it: Parse and String (Name, Params), Validate (Params), the
// Spec predicates and SampleSize (Scope), BaseStaleness (Scope, Params),
// NewDecider (Dynamic), the Checker (Scope, Pace), the simulator (Server),
// and the help texts and error messages of psp and the CLI (Help, Grammar,
// KindList).
var kinds = [...]KindInfo{
	{Kind: ASP, Name: "asp", Scope: NoCheck,
		Help: "asynchronous: always passes"},
	{Kind: BSP, Name: "bsp", Scope: Everyone,
		Help: "bulk synchronous: passes when every node has step ≥ c"},
	{Kind: SSP, Name: "ssp", Params: []Param{{"S", FieldStaleness}}, Scope: Everyone,
		Help: "stale synchronous: passes when every node has step ≥ c − S"},
	{Kind: PBSP, Name: "pbsp", Params: []Param{{"B", FieldBeta}}, Scope: Sampled, Pace: true,
		Help: "probabilistic BSP: passes when B peers drawn uniformly without replacement all have step ≥ c"},
	{Kind: PSSP, Name: "pssp", Params: []Param{{"B", FieldBeta}, {"S", FieldStaleness}}, Scope: Sampled, Pace: true,
		Help: "probabilistic SSP: passes when B sampled peers all have step ≥ c − S"},
	{Kind: DSSP, Name: "dssp", Params: []Param{{"SL", FieldStaleness}, {"SU", FieldUpper}}, Scope: Everyone, Dynamic: true, Server: true,
		Help: "dynamic SSP: passes within SL steps of the slowest node, or when granted extra steps up to SU"},
	{Kind: PDSSP, Name: "pdssp", Params: []Param{{"B", FieldBeta}, {"SL", FieldStaleness}, {"SU", FieldUpper}}, Scope: Sampled, Dynamic: true,
		Help: "decentralised dynamic SSP: as dssp, over a sample of B peers"},
}

// KindInfo is one entry of the kinds table: all that psp, the simulator
// and the CLI know of a barrier kind.
type KindInfo struct {
	Kind Kind
	// Name is the kind as specs write it ("pssp"): lower case, no colon.
	Name string
	// Params are the spec's parameters in the order it writes them
	// (name:p1:p2...), each setting one Spec field. A Spec field no
	// parameter sets is zero.
	Params []Param
	// Scope is which peers a check asks.
	Scope Scope
	// Dynamic: the staleness varies at run time within [Staleness, Upper]:
	// the Decider is a DSSP controller (NewPDSSP) rather than the static
	// test at BaseStaleness. A dynamic kind takes both staleness fields.
	Dynamic bool
	// Pace: the pace rule (CheckConfig.Pace) applies to its checks. Only
	// for sampled static kinds.
	Pace bool
	// Server: the kind's reference runs on a server. The simulator runs
	// that controller (DSSPController, from Staleness and Upper) as a
	// baseline instead of each node's Checker; a node, which has no
	// server, runs the kind's Decider over every peer it knows.
	Server bool
	// Help says in one line when the barrier passes, c being the node's
	// step and the parameters as Params names them.
	Help string
}

// Field is a Spec field a spec parameter sets.
type Field uint8

// The Spec fields a parameter may set.
const (
	FieldBeta      Field = iota + 1 // Spec.Beta; "auto" sets Spec.Auto (Beta AutoBetaCap)
	FieldStaleness                  // Spec.Staleness: s, or S_L
	FieldUpper                      // Spec.Upper: S_U
)

// Param is one parameter of a kind's specs.
type Param struct {
	Name  string // as the grammar writes it: "B", "S", "SL", "SU"
	Field Field
}

// Scope is which peers a barrier's check asks. The zero Scope is an
// invalid kind's.
type Scope uint8

// The scopes.
const (
	NoCheck  Scope = iota + 1 // no check: the barrier always passes (ASP)
	Everyone                  // every node's step (BSP, SSP, DSSP): the global barriers
	Sampled                   // β peers drawn uniformly without replacement (pBSP, pSSP, pDSSP)
)

// paramLegend says what the parameters mean, for Grammar.
var paramLegend = fmt.Sprintf("B = sample size β, or auto: a third of the other nodes, 1 to %d; "+
	"S = staleness, SL..SU = DSSP staleness range", AutoBetaCap)

// Grammar is the barrier spec grammar, for help texts: every kind's form
// (KindInfo.Form) and what the parameters mean.
var Grammar = grammar()

func grammar() string {
	forms := make([]string, len(kinds))
	for i, k := range kinds {
		forms[i] = k.Form()
	}
	return strings.Join(forms, " | ") + " (" + paramLegend + ")"
}

// Kinds returns the kinds table, in Kind order (a copy: changing it
// changes nothing in the package).
func Kinds() []KindInfo {
	out := make([]KindInfo, len(kinds))
	for i, k := range kinds {
		out[i], _ = k.Kind.Info()
	}
	return out
}

// Info returns a copy of the kind's table entry, and whether the kind is
// valid (the zero KindInfo if not).
func (k Kind) Info() (KindInfo, bool) {
	i := k.info()
	if i.Kind == 0 {
		return KindInfo{}, false
	}
	out := *i
	out.Params = slices.Clone(i.Params)
	return out, true
}

// noKind is an invalid kind's entry.
var noKind KindInfo

// info is Info without the flag or the copy, for the predicates a check
// calls often.
func (k Kind) info() *KindInfo {
	if i := uint(k) - 1; i < uint(len(kinds)) { // Kind 0 wraps around
		return &kinds[i]
	}
	return &noKind
}

// String returns the kind's name as used in specs ("pssp").
func (k Kind) String() string {
	if i := k.info(); i.Kind != 0 {
		return i.Name
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Form is the kind's spec as the grammar writes it ("pssp:B:S").
func (k KindInfo) Form() string {
	form := k.Name
	for _, p := range k.Params {
		form += ":" + p.Name
	}
	return form
}

// Takes reports whether one of the kind's parameters sets field f.
func (k KindInfo) Takes(f Field) bool {
	for _, p := range k.Params {
		if p.Field == f {
			return true
		}
	}
	return false
}

// KindList names the kinds keep accepts, in table order, as a sentence
// joined by conj ("pbsp, pssp and pdssp"), for help texts and errors.
func KindList(conj string, keep func(KindInfo) bool) string {
	var names []string
	for _, k := range kinds {
		if keep(k) {
			names = append(names, k.Name)
		}
	}
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " " + conj + " " + names[len(names)-1]
}

// KindsHelp is a help text's list of the kinds, one per line: each
// indented form and its Help, then the parameters' legend.
func KindsHelp(indent string) string {
	width := 0
	for _, k := range kinds {
		width = max(width, len(k.Form()))
	}
	var b strings.Builder
	for _, k := range kinds {
		fmt.Fprintf(&b, "%s%-*s  %s\n", indent, width, k.Form(), k.Help)
	}
	fmt.Fprintf(&b, "%s(c = the node's step; %s)", indent, paramLegend)
	return b.String()
}
