package exchange

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/pspnode/pspnode/gossip"
	"github.com/pspnode/pspnode/internal/wire"
)

// Kind names an exchange.
type Kind uint8

// The exchanges.
const (
	Gossip   Kind = 0 // every delta to every node over GossipSub
	Epidemic Kind = 1 // each model to S sampled peers, averaged
)

// Averages says whether the exchange averages models (epidemic) rather
// than adding deltas (gossip), a fact of the kind: a node then pushes its
// model after each step, not the step's delta (Exchange.Push), and trains
// at the schedule's learning rate, unscaled, where under gossip it scales
// the rate by 1/N̂ (see the package comment).
func (k Kind) Averages() bool { return k == Epidemic }

func (k Kind) String() string {
	switch k {
	case Gossip:
		return "gossip"
	case Epidemic:
		return "epidemic"
	}
	return fmt.Sprintf("unknown (%d)", k)
}

// Spec is which exchange a node runs, as --exchange says it. The zero
// value is gossip. All nodes of a job must run the same kind (S may
// differ).
type Spec struct {
	Kind Kind
	// S is how many peers an epidemic node sends its model to after each
	// step (at least 1).
	S int
	// Encoding is how an epidemic node's model travels (wire.Encoding*:
	// 0 or wire.EncodingFloat32 float32, wire.EncodingBF16,
	// wire.EncodingInt8, wire.EncodingInt4), "epidemic:S:bf16",
	// "epidemic:S:int8" or "epidemic:S:int4". A node
	// sends a compressed model with error feedback: what a round's
	// rounding left out of what it sent is added to the next round's
	// model before it is rounded. It takes any encoding.
	Encoding byte
	// Fragments cuts an epidemic node's model into that many fragments of
	// consecutive values (0 or 1: none), "epidemic:S:fragments=F": the
	// round of step k sends, takes in and averages fragment k mod F alone
	// (wire.Layout), so each round carries 1/F of the model (streaming
	// DiLoCo, where each outer step synchronises one fragment). Every node
	// of a job must cut its model alike: a fragment of another F is refused
	// at its offer.
	Fragments int
}

// encodings are the names of Spec.Encoding's compressed values.
var encodings = map[string]byte{"bf16": wire.EncodingBF16, "int8": wire.EncodingInt8, "int4": wire.EncodingInt4}

// String renders the spec as Parse reads it.
func (s Spec) String() string {
	if s.Kind != Epidemic {
		return "gossip"
	}
	out := "epidemic:" + strconv.Itoa(s.S)
	for name, e := range encodings {
		if e == s.Encoding {
			out += ":" + name
		}
	}
	if s.Fragments > 1 {
		out += ":fragments=" + strconv.Itoa(s.Fragments)
	}
	return out
}

// Parse reads "gossip" or "epidemic:S" (S a whole number >= 1), then
// optionally ":bf16", ":int8" or ":int4" (models sent compressed), then
// optionally ":fragments=F" (the model sent a fragment a round).
func Parse(s string) (Spec, error) {
	if s == "gossip" {
		return Spec{}, nil
	}
	rest, ok := strings.CutPrefix(s, "epidemic:")
	if !ok {
		return Spec{}, fmt.Errorf("%q: want gossip or epidemic:S, e.g. epidemic:4", s)
	}
	parts := strings.Split(rest, ":")
	v, err := strconv.Atoi(parts[0])
	if err != nil || v < 1 {
		return Spec{}, fmt.Errorf("%q: S must be a whole number >= 1 (peers each model goes to), e.g. epidemic:4", s)
	}
	spec := Spec{Kind: Epidemic, S: v}
	parts = parts[1:]
	if len(parts) > 0 && !strings.HasPrefix(parts[0], "fragments=") {
		enc, known := encodings[parts[0]]
		if !known {
			return Spec{}, fmt.Errorf("%q: the model's encoding %q is not one of bf16, int8, int4 (or none: float32)", s, parts[0])
		}
		spec.Encoding, parts = enc, parts[1:]
	}
	if len(parts) > 0 {
		f, err := strconv.Atoi(strings.TrimPrefix(parts[0], "fragments="))
		if !strings.HasPrefix(parts[0], "fragments=") || err != nil || f < 1 || f > wire.MaxFragments {
			return Spec{}, fmt.Errorf("%q: %q: want fragments=F, 1 <= F <= %d (the model sent a fragment a round)", s, parts[0], wire.MaxFragments)
		}
		spec.Fragments, parts = f, parts[1:]
	}
	if len(parts) > 0 {
		return Spec{}, fmt.Errorf("%q: want epidemic:S[:bf16|:int8|:int4][:fragments=F]", s)
	}
	return spec, nil
}

// Set implements flag.Value.
func (s *Spec) Set(v string) error {
	p, err := Parse(v)
	if err != nil {
		return err
	}
	*s = p
	return nil
}

// maxS bounds S: a node sends S models per step.
const maxS = 1024

// Config is a node's exchange: which one (Spec) and the limits of what it
// takes from its peers, which are its own, apart from GossipSub's (under
// gossip the update topic's validator gets them from here).
type Config struct {
	Spec
	// NormBound bounds the influence of one received update: an update
	// whose L2 norm exceeds NormBound × the upper quartile of the norms
	// of this node's own recent updates is refused; under epidemic a
	// model farther than NormBound × (1 + S) × that from this node's is
	// (0 disables the check).
	NormBound float64
	// MaxAbsValue bounds every value of an update or model, sent or
	// taken: beyond it a message is refused whole.
	MaxAbsValue float64
	// MaxStepAhead refuses updates and models made at a step more than
	// this far ahead of this node's (<= 0: no check).
	MaxStepAhead int64
	// StaleSteps weighs the models a node averages in by how stale they
	// are (epidemic): a model made k steps behind this node's counts
	// 1/(1 + k/StaleSteps) of a fresh one (0: each counts fully). A slow
	// peer's models, tens of steps behind, then pull the fast nodes back
	// little, and its steps still reach them. Gossip does not weigh:
	// every node adds every update, and weights that differ between
	// receivers (each its own lag) would leave the models apart for good,
	// where averaging pulls epidemic models back together.
	StaleSteps float64
}

// staleWeight is the weight of what a peer made lag steps behind this
// node (see Config.StaleSteps).
func (c Config) staleWeight(lag int64) float64 {
	if c.StaleSteps <= 0 || lag <= 0 {
		return 1
	}
	return 1 / (1 + float64(lag)/c.StaleSteps)
}

// DefaultConfig is epidemic:4 with the default limits: NormBound 4,
// gossip's MaxAbsValue and MaxStepAhead, and StaleSteps 4 (a model 4
// steps behind counts half).
//
// Why epidemic by default: what a node receives per step is S models
// whatever N, where under gossip it is N−1 updates times GossipSub's
// amplification, and grows with the job. Gossip's models are a little
// less noisy early on (every node sees every gradient), which pays in
// small jobs on good links; choose it there.
func DefaultConfig() Config {
	g := gossip.DefaultConfig()
	return Config{Spec: Spec{Kind: Epidemic, S: 4}, NormBound: 4, MaxAbsValue: g.MaxAbsValue, MaxStepAhead: g.MaxStepAhead, StaleSteps: 4}
}

// Validate checks the spec and the limits; each error names the field at
// fault as node.Config spells it (Exchange.X).
func (c Config) Validate() error {
	var errs []string
	switch {
	case c.Kind == Gossip && c.S == 0:
	case c.Kind == Epidemic && c.S >= 1 && c.S <= maxS:
	default:
		errs = append(errs, fmt.Sprintf("Exchange %s (kind %d, S %d): want gossip or epidemic:S with 1 <= S <= %d", c.Spec, c.Kind, c.S, maxS))
	}
	if c.Fragments < 0 || c.Fragments > wire.MaxFragments || c.Fragments > 1 && c.Kind != Epidemic {
		errs = append(errs, fmt.Sprintf("Exchange.Fragments %d: want 0 to %d, and more than 1 only under the epidemic exchange", c.Fragments, wire.MaxFragments))
	}
	if !(c.NormBound >= 0) || math.IsInf(c.NormBound, 0) {
		errs = append(errs, fmt.Sprintf("Exchange.NormBound %v must be a finite number >= 0", c.NormBound))
	}
	if !(c.StaleSteps >= 0) || math.IsInf(c.StaleSteps, 0) {
		errs = append(errs, fmt.Sprintf("Exchange.StaleSteps %v must be a finite number >= 0", c.StaleSteps))
	}
	if !(c.MaxAbsValue > 0) || math.IsInf(c.MaxAbsValue, 0) {
		errs = append(errs, fmt.Sprintf("Exchange.MaxAbsValue %v must be positive and finite", c.MaxAbsValue))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

// limits are gossip's message limits for a model of params parameters
// whose architecture is modelID.
func (c Config) limits(params int, modelID uint32) gossip.Limits {
	return gossip.Limits{
		MaxMessageSize: gossip.MaxEncodedSize(params),
		ParamCount:     params,
		ModelID:        modelID,
		MaxAbsValue:    c.MaxAbsValue,
		MaxStepAhead:   c.MaxStepAhead,
	}
}
