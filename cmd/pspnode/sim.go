package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/peterbourgon/ff/v3/ffcli"
	"github.com/pspnode/pspnode/psp"
	"github.com/pspnode/pspnode/testnet/sim"
)

// paperBarriers are the five barriers of the PSP paper's step experiment.
const paperBarriers = "asp,bsp,ssp:4,pbsp:10,pssp:10:4"

func simCommand(stdout, stderr io.Writer) *ffcli.Command {
	fs := newFlagSet("pspnode sim", stderr)
	def := sim.DefaultConfig()
	var (
		barriers  specList
		sweep     intList
		stragg    = fractionFlag(0)
		pace      = paceFlag{def.Pace}
		factor    = positiveFlag(def.StraggleFactor)
		scale     = positiveFlag(def.TimeScale)
		churn     = fs.Float64("churn", 0, "fraction of the initial nodes replaced per minute (sets --leave-rate and --join-rate)")
		leave     = fs.Float64("leave-rate", 0, "fraction of the initial nodes leaving per minute")
		join      = fs.Float64("join-rate", 0, "fraction of the initial nodes joining per minute")
		replace   = fs.Bool("churn-replace", false, "bring a fresh node in as each node leaves (--join-rate ignored): the population holds at --nodes")
		churnMode = fs.String("churn-mode", def.ChurnMode.String(), "how leavers leave: crash, graceful or mixed")
		nodes     = fs.Int("nodes", def.Nodes, "number of nodes")
		duration  = fs.Duration("duration", time.Duration(def.Duration)*time.Second, "simulated time")
		seed      = fs.Uint64("seed", def.Seed, "random seed; a run is a pure function of its flags")
		mode      = fs.String("mode", "fidelity", "fidelity (re-check every waiting node at every completion, as the paper), poll (every --poll-interval; for very large N) or timed (when the nodes' own barrier policy would: their re-check timing, wakes by peers' progress)")
		poll      = fs.Duration("poll-interval", 250*time.Millisecond, "re-check interval of waiting nodes in poll mode")
		record    = fs.Duration("record-every", time.Second, "interval of the per-node step series (0: off)")
		out       = fs.String("out", "", "write CSV, summary.json and PNG figures to this directory")
		asJSON    = fs.Bool("json", false, "print exactly one JSON value on stdout (an object, or an array for several runs)")
	)
	_ = barriers.Set(paperBarriers)
	fs.Var(&barriers, "barrier", barrierHelp("barrier spec, or a comma-separated list to compare"))
	fs.Var(&sweep, "sweep-beta", "run the (single, probabilistic) barrier once per sample size in this list, e.g. 0,1,2,4,8,16,32,64")
	fs.Var(&stragg, "stragglers", "fraction of nodes that are stragglers")
	fs.Var(&factor, "straggle-factor", "task time multiplier of stragglers")
	fs.Var(&scale, "time-scale", "multiplies the paper's task time (Exp(1)+1) s")
	fs.Var(&pace, "pace", paceHelp)
	return &ffcli.Command{
		Name:       "sim",
		ShortUsage: "pspnode sim [--nodes N] [--duration 200s] [--barrier SPEC[,SPEC...]] [flags]",
		ShortHelp:  "simulate N nodes under one or more barriers (discrete-event, deterministic)",
		LongHelp: `Simulates N nodes with the PSP paper's time model: a task takes
(Exp(1)+1) s × straggle factor × time scale. Barrier decisions are made by
the same psp code a real node runs. With no flags it runs the paper's step
experiment: 200 nodes, 200 s, ` + paperBarriers + `.

Examples:
  pspnode sim --out results/sim
  pspnode sim --barrier pbsp:10 --sweep-beta 0,1,2,4,8,16,32,64 --json
  pspnode sim --barrier bsp,pssp:10:4 --churn 0.2 --churn-mode crash
  pspnode sim --nodes 10000 --barrier pbsp:10 --mode poll
  pspnode sim --barrier pbsp:10,pssp:10:4 --mode timed   # the nodes' own re-check policy` + barrierSpecsHelp,
		FlagSet: fs,
		Options: envOptions(),
		Exec: func(ctx context.Context, args []string) error {
			if len(args) > 0 {
				return usagef("sim takes no arguments, got %q", args)
			}
			cfg := sim.DefaultConfig()
			cfg.Nodes, cfg.Duration, cfg.Seed = *nodes, duration.Seconds(), *seed
			cfg.Stragglers, cfg.StraggleFactor, cfg.TimeScale, cfg.Pace = stragg.x, factor.x, scale.x, pace.c
			cfg.LeaveRate, cfg.JoinRate, cfg.Replace = *leave, *join, *replace
			if *churn != 0 {
				cfg.LeaveRate, cfg.JoinRate = *churn, *churn
			}
			cm, err := sim.ParseChurnMode(*churnMode)
			if err != nil {
				return usageError{err}
			}
			cfg.ChurnMode = cm
			switch *mode {
			case "fidelity":
				cfg.Mode = sim.Fidelity
			case "poll":
				cfg.Mode = sim.Poll
			case "timed":
				cfg.Mode = sim.Timed
			default:
				return usagef("--mode %q: want fidelity, poll or timed", *mode)
			}
			cfg.PollInterval, cfg.RecordEvery = poll.Seconds(), record.Seconds()
			specs := []psp.Spec(barriers)
			if len(sweep) > 0 {
				base := specs[0]
				barrierSet := false
				fs.Visit(func(f *flag.Flag) { barrierSet = barrierSet || f.Name == "barrier" })
				if !barrierSet {
					base = psp.Spec{Kind: psp.PBSP} // a sweep of the paper's pBSP
				} else if len(specs) != 1 || !base.Probabilistic() {
					return usagef("--sweep-beta needs one probabilistic barrier (%s), got %q", psp.KindList("or", func(k psp.KindInfo) bool { return k.Scope == psp.Sampled }), barriers.String())
				}
				specs = nil
				for _, b := range sweep {
					sp := base
					sp.Beta, sp.Auto = b, false
					if err := sp.Validate(); err != nil {
						return usageError{err}
					}
					specs = append(specs, sp)
				}
			}
			cfg.Barrier = specs[0]
			if err := cfg.Validate(); err != nil {
				return usageError{err}
			}
			pr := progress{last: time.Now(), every: 2 * time.Second, print: func(f string, a ...any) { fmt.Fprintf(stderr, f, a...) }}
			var results []*sim.Result
			for i, sp := range specs {
				if err := ctx.Err(); err != nil {
					return err
				}
				c := cfg
				c.Barrier = sp
				c.Progress = func(now float64) {
					pr.maybe("sim: run %d/%d (%s): %.0f of %.0f simulated seconds\n", i+1, len(specs), sp, now, c.Duration)
				}
				r, err := sim.Run(c)
				if err != nil {
					return err
				}
				results = append(results, r)
			}
			if *out != "" {
				if err := sim.WriteOut(*out, results, len(sweep) > 0); err != nil {
					return err
				}
				fmt.Fprintf(stderr, "sim: wrote CSV, summary.json and figures to %s\n", *out)
			}
			if *asJSON {
				enc := json.NewEncoder(stdout)
				enc.SetIndent("", "  ")
				if len(results) == 1 && len(sweep) == 0 {
					return enc.Encode(results[0])
				}
				return enc.Encode(results)
			}
			printSimTable(stdout, results)
			return nil
		},
	}
}

func printSimTable(w io.Writer, results []*sim.Result) {
	r0 := results[0]
	fmt.Fprintf(w, "%d nodes, %.0f s simulated, seed %d, %s mode\n", r0.Nodes, r0.DurationS, r0.Seed, r0.Mode)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "barrier\tmin\tmean\tmax\tp5\tp50\tp95\tstddev\twait %\tlag γ\tF(r)\tbound\tstalled\t")
	for _, r := range results {
		bound := "-"
		if r.Lag.BoundOK {
			bound = fmt.Sprintf("%.3g", r.Lag.BoundMu)
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%.1f\t%.0f\t%.0f\t%.0f\t%.0f\t%.2f\t%.1f\t%.3f\t%.3f\t%s\t%d\t\n",
			r.Barrier, r.Steps.Min, r.Steps.Mean, r.Steps.Max, r.Steps.P5, r.Steps.P50, r.Steps.P95, r.Steps.StdDev,
			100*r.WaitFraction, r.Lag.Mean, r.Lag.F, bound, r.StalledNodes)
	}
	tw.Flush()
	if r0.Stragglers == nil {
		return
	}
	fmt.Fprintln(w, "stragglers: final steps of the fast nodes and the stragglers; staleness of each one's steps (the median step of 16 live nodes less theirs); peers the pace rule excused")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "barrier\tfast\tstragglers\tfast staleness\tp95\tstraggler staleness\tp95\texcused slow\tfar\t")
	for _, r := range results {
		st := r.Stragglers
		fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%.2f\t%.0f\t%.2f\t%.0f\t%d\t%d\t\n", r.Barrier, st.FastSteps.Mean, st.StragglerSteps.Mean,
			st.FastStaleness.Mean, st.FastStaleness.P95, st.StragglerStaleness.Mean, st.StragglerStaleness.P95, r.ExcusedSlow, r.ExcusedFar)
	}
	tw.Flush()
}
