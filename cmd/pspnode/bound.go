package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/peterbourgon/ff/v3/ffcli"
	"github.com/pspnode/pspnode/testnet/sim"
)

func boundCommand(stdout, stderr io.Writer) *ffcli.Command {
	fs := newFlagSet("pspnode bound", stderr)
	var (
		betas = intList{1, 2, 4, 8, 16, 32, 64, 100}
		fvals = floatList{0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99}
		r     = fs.Int("staleness", 4, "staleness r")
		T     = fs.Int("T", 10000, "length T of the update sequence")
		out   = fs.String("out", "", "write bound.csv, bound_mean.png and bound_variance.png to this directory")
		js    = fs.Bool("json", false, "print exactly one JSON array on stdout")
	)
	fs.Var(&betas, "beta", "sample sizes β, comma-separated")
	fs.Var(&fvals, "F", "values of the lag CDF F(r), each in (0, 1), comma-separated")
	return &ffcli.Command{
		Name:       "bound",
		ShortUsage: "pspnode bound [--staleness 4] [--T 10000] [--beta 1,2,4,...] [--F 0.1,0.5,...] [--json] [--out DIR]",
		ShortHelp:  "tabulate and plot PSP's convergence bound on the update lag",
		LongHelp: `Evaluates the bounds of the reference chapter on the mean and variance of the
update sequence lag γ_t under PSP, with a = F(r)^β:
  mean     <= S (r(r+1)/2 + a(r+2)/(1-a)^2)
  variance <  S (r(r+1)(2r+1)/6 + a(r^2+4)/(1-a)^3)
  S = (1-a) / (F(r)(1-a) + a - a^(T-r+1))
for each β and each value of F(r), the probability that a node lags at most
r steps.`,
		FlagSet: fs,
		Options: envOptions(),
		Exec: func(_ context.Context, args []string) error {
			if len(args) > 0 {
				return usagef("bound takes no arguments, got %q", args)
			}
			rows, err := sim.BoundTable(fvals, betas, *r, *T)
			if err != nil {
				return usageError{err}
			}
			if *out != "" {
				if err := sim.WriteBound(*out, rows); err != nil {
					return err
				}
				fmt.Fprintf(stderr, "bound: wrote bound.csv, bound_mean.png and bound_variance.png to %s\n", *out)
			}
			if *js {
				enc := json.NewEncoder(stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(rows)
			}
			for _, part := range []struct {
				name string
				get  func(sim.BoundRow) float64
			}{{"mean", func(b sim.BoundRow) float64 { return b.Mean }}, {"variance", func(b sim.BoundRow) float64 { return b.Variance }}} {
				fmt.Fprintf(stdout, "Bound on the %s of the lag γ (r=%d, T=%d); rows F(r), columns β\n", part.name, *r, *T)
				tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
				fmt.Fprint(tw, "F(r)\t")
				for _, b := range betas {
					fmt.Fprintf(tw, "β=%d\t", b)
				}
				fmt.Fprintln(tw)
				for i, f := range fvals {
					fmt.Fprintf(tw, "%.2f\t", f)
					for j := range betas {
						fmt.Fprintf(tw, "%.4g\t", part.get(rows[j*len(fvals)+i]))
					}
					fmt.Fprintln(tw)
				}
				tw.Flush()
				fmt.Fprintln(stdout)
			}
			return nil
		},
	}
}
