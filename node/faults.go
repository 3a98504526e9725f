package node

import (
	"context"
	"time"
)

// Faults make a node misbehave, so that testnets can measure how the honest
// nodes' defences hold. The zero value is an honest node; production nodes
// never set it (pspnode run has no flag for it).
type Faults struct {
	// StepLie, if set, replaces the step the node reports in step replies
	// (a step liar). It is called with the true step.
	StepLie func(step int64) int64
	// ReplyDelay delays every step reply (a slow peer). A delay beyond the
	// asker's QueryTimeout makes the query time out.
	ReplyDelay time.Duration
	// Loss is the probability that an incoming step query or gossip
	// message is lost: the query is left unanswered until the asker's
	// deadline, the message is dropped before validation.
	Loss float64
	// Poison, if set, is called with each update the node would publish
	// and returns the raw message to publish instead (nil: publish
	// nothing). An update poisoner.
	Poison func(step int64, delta []float64) []byte
}

func (f Faults) active() bool {
	return f.StepLie != nil || f.ReplyDelay > 0 || f.Loss > 0 || f.Poison != nil
}

// lost draws whether one incoming message is lost under Faults.Loss.
func (n *Node) lost() bool {
	if n.cfg.Faults.Loss <= 0 {
		return false
	}
	n.rngMu.Lock()
	defer n.rngMu.Unlock()
	return n.rng.Float64() < n.cfg.Faults.Loss
}

// sleepCtx sleeps for d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
