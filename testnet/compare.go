package testnet

import (
	"errors"
	"math"

	"github.com/pspnode/pspnode/testnet/plan"
	"github.com/pspnode/pspnode/testnet/report"
	"github.com/pspnode/pspnode/testnet/sim"
)

// CompareWithSim runs the simulator with the testnet's parameters, in
// fidelity mode and in poll mode at the nodes' measured re-check rate, and
// stores the real/simulated ratios in r.CompareSim.
func CompareWithSim(cfg plan.Config, r *report.Result) error {
	if cfg.TimeScale <= 0 {
		return errors.New("comparing with the simulator needs the time model: a positive time scale")
	}
	sc := sim.DefaultConfig()
	sc.Nodes, sc.Duration, sc.Barrier, sc.Seed = cfg.Nodes, r.DurationS, cfg.Barrier, cfg.Seed
	sc.TimeScale, sc.Stragglers, sc.StraggleFactor, sc.Pace = cfg.TimeScale, cfg.Stragglers, cfg.StraggleFactor, cfg.Pace
	sc.LeaveRate, sc.JoinRate, sc.ChurnMode, sc.Replace = cfg.Churn, cfg.Churn, cfg.ChurnMode, cfg.ChurnReplace
	sc.RecordEvery = 0
	sc.Mode = sim.Fidelity
	fid, err := sim.Run(sc)
	if err != nil {
		return err
	}
	sc.Mode, sc.PollInterval = sim.Poll, 0.05
	if r.ChecksPerWaitS > 0 {
		sc.PollInterval = 1 / r.ChecksPerWaitS
	}
	poll, err := sim.Run(sc)
	if err != nil {
		return err
	}
	r.CompareSim = &report.Comparison{
		Sim: fid.Steps, Ratio: stepRatios(r.Steps, fid.Steps),
		PollIntervalS: sc.PollInterval, Poll: poll.Steps, PollRatio: stepRatios(r.Steps, poll.Steps),
	}
	return nil
}

// stepRatios is real/simulated for each step figure (NaN over a zero).
func stepRatios(real, sim sim.Stats) map[string]float64 {
	ratio := func(a, b float64) float64 {
		if b == 0 {
			return math.NaN()
		}
		return a / b
	}
	return map[string]float64{
		"min": ratio(real.Min, sim.Min), "mean": ratio(real.Mean, sim.Mean),
		"max": ratio(real.Max, sim.Max), "p5": ratio(real.P5, sim.P5),
		"p50": ratio(real.P50, sim.P50), "p95": ratio(real.P95, sim.P95),
	}
}
