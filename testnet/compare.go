package testnet

import (
	"encoding/json"
	"errors"
	"math"

	"github.com/pspnode/pspnode/testnet/sim"
)

// Comparison sets the testnet beside the simulator run with the same
// parameters, twice: Sim in fidelity mode (every waiting node re-checks at
// every completion, as the paper's simulator does) and Poll in poll mode,
// where waiting nodes re-check every PollIntervalS, the interval the
// testnet's nodes kept (1 / ChecksPerWaitS). Ratio and PollRatio are
// real/simulated for each step figure.
type Comparison struct {
	Sim           sim.Stats
	Ratio         map[string]float64
	PollIntervalS float64
	Poll          sim.Stats
	PollRatio     map[string]float64
}

// CompareWithSim runs the simulator with the testnet's parameters, in
// fidelity mode and in poll mode at the nodes' measured re-check rate, and
// stores the real/simulated ratios in r.CompareSim.
func CompareWithSim(cfg Config, r *Result) error {
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
	r.CompareSim = &Comparison{
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

// MarshalJSON keeps NaN (ratios of zero) out of the JSON.
func (c Comparison) MarshalJSON() ([]byte, error) {
	finite := func(m map[string]float64) map[string]*float64 {
		out := map[string]*float64{}
		for k, v := range m {
			if !math.IsNaN(v) && !math.IsInf(v, 0) {
				out[k] = &v
			} else {
				out[k] = nil
			}
		}
		return out
	}
	return json.Marshal(struct {
		Sim           sim.Stats           `json:"sim_steps"`
		Ratio         map[string]*float64 `json:"ratio"`
		PollIntervalS float64             `json:"poll_interval_s"`
		Poll          sim.Stats           `json:"poll_steps"`
		PollRatio     map[string]*float64 `json:"poll_ratio"`
	}{c.Sim, finite(c.Ratio), c.PollIntervalS, c.Poll, finite(c.PollRatio)})
}
