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
// (node.Config.PollShare).
const pollShareHelp = "waiting at a sampled barrier, re-check once per expected step completion in the job (compute time / N), but at most once every this share of the compute time per step; in (0, 1]"

// share is a float flag in (0, 1].
type share float64

func (f *share) String() string { return strconv.FormatFloat(float64(*f), 'g', -1, 64) }
func (f *share) Set(v string) error {
	x, err := strconv.ParseFloat(v, 64)
	if err != nil || !(x > 0 && x <= 1) {
		return fmt.Errorf("%q is not a share in (0, 1]", v)
	}
	*f = share(x)
	return nil
}

// exchangeHelp is --exchange's help, shared by run and testnet
// (node.Config.Exchange).
const exchangeHelp = "how nodes combine their work: gossip (every update to every node over GossipSub) or epidemic:S (after each step the model goes to S peers drawn by the barrier's sampler, which average it with their own: traffic per node constant in N; see docs/exchange.md). Nodes of a job must agree"

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

// fraction is a float flag restricted to [0, 1].
type fraction float64

func (f *fraction) String() string { return strconv.FormatFloat(float64(*f), 'g', -1, 64) }
func (f *fraction) Set(v string) error {
	x, err := strconv.ParseFloat(v, 64)
	if err != nil || !(x >= 0 && x <= 1) {
		return fmt.Errorf("%q is not a fraction in [0, 1]", v)
	}
	*f = fraction(x)
	return nil
}

// positive is a float flag that must be > 0 and finite.
type positive float64

func (f *positive) String() string { return strconv.FormatFloat(float64(*f), 'g', -1, 64) }
func (f *positive) Set(v string) error {
	x, err := strconv.ParseFloat(v, 64)
	if err != nil || !(x > 0) || math.IsInf(x, 0) {
		return fmt.Errorf("%q is not a positive number", v)
	}
	*f = positive(x)
	return nil
}

// nonNegative is a float flag that must be >= 0 and finite.
type nonNegative float64

func (f *nonNegative) String() string { return strconv.FormatFloat(float64(*f), 'g', -1, 64) }
func (f *nonNegative) Set(v string) error {
	x, err := strconv.ParseFloat(v, 64)
	if err != nil || !(x >= 0) || math.IsInf(x, 0) {
		return fmt.Errorf("%q is not a number >= 0", v)
	}
	*f = nonNegative(x)
	return nil
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
