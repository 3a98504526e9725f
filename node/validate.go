package node

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/pspnode/pspnode/gossip"
	"github.com/pspnode/pspnode/internal/jobname"
	"github.com/pspnode/pspnode/node/exchange"
)

// Validate checks the configuration before New builds anything (New also
// checks what it must agree on with the options: a task for a driven node,
// a listen address or a host, no swarm key with a given host): every
// field's range, the order of its bounds, and the sub-configurations
// (Barrier, Overlay, Gossip, Join, NAT, Exchange, Screen) as the node will
// use them, with Job and the bootstrap peers filled in. It reports every
// problem it finds, joined; each names the field at fault as it is spelt
// in Config (Overlay's and Gossip's errors name theirs in overlay.Config
// and gossip.Config).
//
// Two pairs of bounds may cross on purpose: a cap below its floor wins
// (Check.PollMax under PollMin, QueryTimeout under QueryTimeoutMin; see
// timing.go), so that one flag (pspnode run --poll-max, --query-timeout)
// sets an interval outright.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if err := jobname.Validate(c.Job); err != nil {
		bad("Job: %w", err)
	}
	if err := c.Barrier.Validate(); err != nil {
		bad("Barrier: %w", err)
	}
	if c.Barrier.Probabilistic() && c.Overlay.PoolSize < c.Barrier.Beta {
		// Sample draws from the pool; a pool smaller than β cannot give β
		// peers, and every check would fall back to all known peers.
		bad("barrier %s samples β = %d peers but the sampler pool holds %d (Overlay.PoolSize): set Overlay.PoolSize to at least %d, or lower β",
			c.Barrier, c.Barrier.Beta, c.Overlay.PoolSize, c.Barrier.Beta)
	}
	errs = append(errs, c.validateNetwork()...)
	if c.Limits.ConnLow < 0 || c.Limits.ConnHigh < c.Limits.ConnLow {
		bad("Limits.ConnLow %d, Limits.ConnHigh %d: need 0 <= ConnLow <= ConnHigh", c.Limits.ConnLow, c.Limits.ConnHigh)
	}
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"MaxSteps", c.MaxSteps}, {"WaitPeers", int64(c.WaitPeers)}, {"Check.Replacements", int64(c.Check.Replacements)},
		{"Check.GlobalQueries", int64(c.Check.GlobalQueries)}, {"EvalEvery", int64(c.EvalEvery)},
		{"CheckpointEvery", int64(c.CheckpointEvery)}, {"Limits.StepStreams", int64(c.Limits.StepStreams)},
	} {
		if f.v < 0 {
			bad("%s must not be negative (got %d)", f.name, f.v)
		}
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"Duration", c.Duration}, {"StartTimeout", c.StartTimeout}} {
		if d.v < 0 {
			bad("%s must not be negative (got %v)", d.name, d.v)
		}
	}
	for _, s := range []struct {
		name string
		v    float64
	}{{"Check.PollShare", c.Check.PollShare}, {"Check.GlobalPollShare", c.Check.GlobalPollShare}} {
		if !(s.v > 0 && s.v <= 1) {
			bad("%s %v must be in (0, 1]", s.name, s.v)
		}
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"Check.PollMin", c.Check.PollMin}, {"Check.PollMax", c.Check.PollMax},
		{"Check.QueryTimeoutMin", c.Check.QueryTimeoutMin}, {"Check.QueryTimeout", c.Check.QueryTimeout},
	} {
		if d.v <= 0 {
			bad("%s must be a positive duration (got %v)", d.name, d.v)
		}
	}
	if c.Limits.MaxStreamsPerPeer < 1 || c.Limits.MaxInboundStreams < c.Limits.MaxStreamsPerPeer {
		bad("Limits.MaxStreamsPerPeer %d, Limits.MaxInboundStreams %d: need 1 <= MaxStreamsPerPeer <= MaxInboundStreams",
			c.Limits.MaxStreamsPerPeer, c.Limits.MaxInboundStreams)
	}
	if err := c.validateScreen(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Check.Pace.Validate(); err != nil {
		bad("Check.Pace: %w", err)
	}
	if err := c.NAT.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Exchange.Validate(); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, c.validateSubsystems()...)
	return errors.Join(errs...)
}

// validateScreen checks Screen: all zero turns screening off; otherwise its
// thresholds are finite and not negative.
func (c Config) validateScreen() error {
	s := c.Screen
	for _, f := range []struct {
		name string
		v    float64
	}{
		{"StuckIntervals", s.StuckIntervals}, {"StuckMin", s.StuckMin},
		{"Quarantine", s.Quarantine}, {"Forget", s.Forget},
	} {
		if !finiteNonNegative(f.v) {
			return fmt.Errorf("Screen.%s %v must be a finite number >= 0", f.name, f.v)
		}
	}
	if s.MaxPeers < 0 {
		return fmt.Errorf("Screen.MaxPeers must not be negative (got %d)", s.MaxPeers)
	}
	return nil
}

// validateSubsystems checks Overlay and Gossip as New hands them over:
// Job and the bootstrap peers are filled in from Config (overlayConfig).
func (c Config) validateSubsystems() []error {
	job := c.Job
	if jobname.Validate(job) != nil {
		job = "default" // reported once, as Job; check the rest
	}
	var errs []error
	o := overlayConfig(c, nil)
	o.Job = job
	if err := o.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.validateGossip(job); err != nil {
		errs = append(errs, err)
	}
	return errs
}

func finiteNonNegative(v float64) bool { return v >= 0 && !math.IsInf(v, 0) }

// validateGossip checks Gossip, the update topic's configuration for job,
// if the exchange is gossip, as the exchange hands it over: with the
// exchange's limits, and gossip's ParamCount, which the task sets, as 1.
// An epidemic node has no topic; of Gossip it uses only the encoding,
// which must carry a whole model: dense32.
func (c Config) validateGossip(job string) error {
	g := c.Gossip
	if c.Exchange.Kind == exchange.Epidemic {
		if g.Encoding != 0 && g.Encoding != gossip.EncodingDense32 {
			// Sparse encodings carry deltas, not models; float16 would
			// round away every change smaller than about 1e-3 of a
			// parameter (gossip's float16 keeps the residual for the next
			// delta; a whole model has no next delta to carry it).
			return fmt.Errorf("Gossip.Encoding: exchange %s sends whole models: encoding %s does not carry one faithfully; use dense32, or the gossip exchange", c.Exchange.Spec, g.Encoding)
		}
		return nil
	}
	g.Job, g.ParamCount = job, 1
	g.MaxAbsValue, g.MaxStepAhead = c.Exchange.MaxAbsValue, c.Exchange.MaxStepAhead
	if !(g.MaxAbsValue > 0) {
		g.MaxAbsValue = 1 // reported once, as Exchange.MaxAbsValue
	}
	return g.Validate()
}
