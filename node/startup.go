package node

import (
	"sync/atomic"
	"time"

	"github.com/pspnode/pspnode/internal/procstat"
	"github.com/pspnode/pspnode/node/status"
)

// Where a node's start-up goes, for /status (status.Startup): the moments
// it reached each milestone, from the process's start when the platform
// tells it (Linux), else from New.

// milestone is one moment of a node's start-up.
type milestone int

const (
	msListening milestone = iota // the host listens
	msNew                        // New returned: the node answers its peers
	msFirstPeer                  // a peer of the job is known
	msSession                    // a trainer's session began (Driver.Begin)
	msWelcome                    // the session's start is known: Begin returned
	msFirstStep                  // the first step was counted
	milestones
)

// startup holds a node's milestones: nanoseconds since the node started
// (New), 0 until reached. Each is set once.
type startup struct {
	started time.Time // the node's New
	at      [milestones]atomic.Int64
}

// mark records that the node reached m now (the first time only).
func (s *startup) mark(m milestone) {
	d := max(time.Since(s.started), 1)
	s.at[m].CompareAndSwap(0, int64(d))
}

// Startup is where the node's start-up went: each milestone in seconds
// since the process started (since the node's New where the platform does
// not tell when the process started), nil for one not reached.
func (n *Node) Startup() status.Startup {
	var s status.Startup
	base := time.Duration(0)
	if p := procstat.StartTime(); !p.IsZero() && !p.After(n.started) {
		base = n.started.Sub(p)
		s.FromProcess = true
		s.NodeS = ptr(base.Seconds())
	}
	for m, dst := range map[milestone]**float64{
		msListening: &s.ListeningS, msNew: &s.ReadyS, msFirstPeer: &s.FirstPeerS,
		msSession: &s.SessionS, msWelcome: &s.WelcomeS, msFirstStep: &s.FirstStepS,
	} {
		if d := n.boot.at[m].Load(); d > 0 {
			*dst = ptr((base + time.Duration(d)).Seconds())
		}
	}
	return s
}

func ptr(x float64) *float64 { return &x }

// FirstPeer marks the first peer of the job heard from (barrier.Startup).
func (s *startup) FirstPeer() { s.mark(msFirstPeer) }
