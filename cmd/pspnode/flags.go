package main

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/pspnode/pspnode/psp"
)

// pollShareHelp is --poll-share's help, shared by run and testnet
// (node.Config.Check.PollShare).
const pollShareHelp = "waiting at a sampled barrier, re-check once per expected step completion in the job (compute time / N), but at most once every this share of the compute time per step; in (0, 1]"

// exchangeHelp is --exchange's help, shared by run and testnet
// (node.Config.Exchange).
const exchangeHelp = "how nodes combine their work: epidemic:S (after each step the model goes to S peers drawn by the barrier's sampler, which average it with their own: traffic per node constant in N; epidemic:S:bf16, epidemic:S:int8 or epidemic:S:int4 send it compressed, with error feedback; receivers take any encoding; a trailing :fragments=F sends and averages one of F slices a step, streaming DiLoCo's) or gossip (every update to every node over GossipSub: every node sees every gradient, traffic per node grows with N); see docs/exchange.md. Nodes of a job must agree"

// paceHelp is --pace's help, shared by run, testnet and sim
// (psp.PaceConfig), naming the kinds the rule applies to.
var paceHelp = "the pace rule of " + psp.KindList("and", func(k psp.KindInfo) bool { return k.Pace }) + " checks, FACTOR:HORIZON or off: a sampled peer behind the threshold that steps more than FACTOR times slower than this node's own compute time, or would need more than HORIZON of this node's steps to reach the threshold, is not waited for (docs/barriers.md)"

// paceFlag is --pace: FACTOR:HORIZON, or off.
type paceFlag struct{ c psp.PaceConfig }

func (f *paceFlag) String() string { return f.c.String() }

func (f *paceFlag) Set(v string) error {
	c, err := psp.ParsePace(v)
	if err == nil {
		f.c = c
	}
	return err
}

// intList is a comma-separated list of non-negative integers flag.
type intList []int

func (l *intList) String() string {
	s := make([]string, len(*l))
	for i, v := range *l {
		s[i] = strconv.Itoa(v)
	}
	return strings.Join(s, ",")
}

func (l *intList) Set(v string) error {
	var out []int
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 {
			return fmt.Errorf("%q is not a non-negative integer", f)
		}
		out = append(out, n)
	}
	*l = out
	return nil
}

// floatList is a comma-separated list of floats flag.
type floatList []float64

func (l *floatList) String() string {
	s := make([]string, len(*l))
	for i, v := range *l {
		s[i] = strconv.FormatFloat(v, 'g', -1, 64)
	}
	return strings.Join(s, ",")
}

func (l *floatList) Set(v string) error {
	var out []float64
	for _, f := range strings.Split(v, ",") {
		x, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || math.IsNaN(x) || math.IsInf(x, 0) {
			return fmt.Errorf("%q is not a number", f)
		}
		out = append(out, x)
	}
	*l = out
	return nil
}

// barrierHelp is --barrier's help: what follows names the spec (or list)
// the flag takes, then the grammar (psp.Grammar).
func barrierHelp(what string) string { return what + " (" + psp.Grammar + ")" }

// barrierSpecsHelp is the list of barrier kinds closing the long help of
// the commands that take --barrier (psp.KindsHelp).
var barrierSpecsHelp = "\n\nBarrier specs (--barrier):\n" + psp.KindsHelp("  ")

// specList is a comma-separated list of barrier specs.
type specList []psp.Spec

func (l *specList) String() string {
	s := make([]string, len(*l))
	for i, v := range *l {
		s[i] = v.String()
	}
	return strings.Join(s, ",")
}

func (l *specList) Set(v string) error {
	var out []psp.Spec
	for _, f := range strings.Split(v, ",") {
		sp, err := psp.Parse(f)
		if err != nil {
			return err
		}
		out = append(out, sp)
	}
	*l = out
	return nil
}

// floatFlag is a float flag bounded to an interval: Set refuses values
// outside it, NaN and the infinities, with an error saying what it wants
// (the flag package adds the flag's name). Make one with shareFlag,
// fractionFlag, positiveFlag or nonNegativeFlag.
type floatFlag struct {
	x              float64
	lo, hi         float64 // the interval's ends
	loOpen, hiOpen bool    // whether lo and hi are outside it
	want           string  // what a value must be, e.g. "a share in (0, 1]"
}

// shareFlag is a float flag in (0, 1] set to x.
func shareFlag(x float64) floatFlag {
	return floatFlag{x: x, lo: 0, hi: 1, loOpen: true, want: "a share in (0, 1]"}
}

// fractionFlag is a float flag in [0, 1] set to x.
func fractionFlag(x float64) floatFlag {
	return floatFlag{x: x, lo: 0, hi: 1, want: "a fraction in [0, 1]"}
}

// positiveFlag is a finite float flag > 0 set to x.
func positiveFlag(x float64) floatFlag {
	return floatFlag{x: x, lo: 0, hi: math.Inf(1), loOpen: true, hiOpen: true, want: "a positive number"}
}

// nonNegativeFlag is a finite float flag >= 0 set to x.
func nonNegativeFlag(x float64) floatFlag {
	return floatFlag{x: x, lo: 0, hi: math.Inf(1), hiOpen: true, want: "a number >= 0"}
}

func (f *floatFlag) String() string { return strconv.FormatFloat(f.x, 'g', -1, 64) }

func (f *floatFlag) Set(v string) error {
	x, err := strconv.ParseFloat(v, 64)
	if err != nil || !f.contains(x) {
		return fmt.Errorf("%q is not %s", v, f.want)
	}
	f.x = x
	return nil
}

// contains says whether x is in f's interval (never NaN: every
// comparison with NaN is false).
func (f *floatFlag) contains(x float64) bool {
	aboveLo := x >= f.lo
	if f.loOpen {
		aboveLo = x > f.lo
	}
	belowHi := x <= f.hi
	if f.hiOpen {
		belowHi = x < f.hi
	}
	return aboveLo && belowHi
}

// progress prints a line to w at most every interval.
type progress struct {
	last  time.Time
	every time.Duration
	print func(format string, a ...any)
}

func (p *progress) maybe(format string, a ...any) {
	if time.Since(p.last) >= p.every {
		p.last = time.Now()
		p.print(format, a...)
	}
}

const staleStepsHelp = "weigh the models averaged in by their staleness (epidemic): a model made k steps behind this node's counts 1/(1 + k/S) of a fresh one, so that a slow peer's models pull the fast nodes back little (0: every one counts fully; gossip adds every update at full weight)"
