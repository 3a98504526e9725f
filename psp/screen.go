package psp

// Screening bounds the influence a lying or broken peer has on barrier
// decisions. A node cannot verify the step a peer reports, but it can hold
// the peer to what it reported before, since an honest step only grows:
//
//   - A peer that reports a lower step than it reported earlier is lying (or
//     restarted): its reports are ignored for the quarantine period.
//   - A peer whose reported step has not advanced for the stuck window is
//     stuck (a liar that reports 0 forever, a hung task, a node blocked for
//     good): while it stays at that step its report is ignored, so one
//     such peer cannot hold back everyone who samples it. It counts again
//     the moment it reports progress.
//
// The stuck window scales with the asking node's own step interval (an
// honest straggler advances every few of the asker's intervals, and under a
// barrier the asker's interval is itself stretched by the stragglers it
// waits for), so it means the same at any step time.
//
// A peer that reports a step far ahead is not screened: being ahead never
// makes a barrier wait, so such a lie can only hide one lagging peer from a
// sample, and it does not accumulate.
//
// The caller drops the observations Check refuses and, for a sampled
// barrier, draws replacements, as it does for peers that do not answer.

// ScreenConfig sets the screening thresholds (seconds on the caller's clock).
type ScreenConfig struct {
	// StuckIntervals × the asker's own step interval without progress
	// makes a peer stuck; StuckMin seconds while the asker's interval is
	// not known yet.
	StuckIntervals float64
	StuckMin       float64
	// Quarantine is how long the reports of a peer that went backwards are
	// ignored.
	Quarantine float64
	// Forget drops the record of a peer not heard from for this long.
	Forget float64
	// MaxPeers caps the records kept; the least recently heard-from peer is
	// forgotten first.
	MaxPeers int
}

// DefaultScreenConfig returns the thresholds the node uses: stuck after 10
// of the asker's intervals (3 s before it knows its interval), a 60 s
// quarantine, records kept for 10 minutes, at most 4096 of them.
func DefaultScreenConfig() ScreenConfig {
	return ScreenConfig{StuckIntervals: 10, StuckMin: 3, Quarantine: 60, Forget: 600, MaxPeers: 4096}
}

// Verdict is Screen's judgement of one report.
type Verdict uint8

// The verdicts. Only Accept lets the observation count.
const (
	Accept      Verdict = iota
	Stuck               // the step has not advanced for the stuck window
	Regressed           // the step is lower than this peer reported before
	Quarantined         // the peer regressed recently; its reports are ignored
)

func (v Verdict) String() string {
	switch v {
	case Accept:
		return "accept"
	case Stuck:
		return "stuck"
	case Regressed:
		return "regressed"
	case Quarantined:
		return "quarantined"
	}
	return "unknown"
}

type screenRecord struct {
	step    Step
	since   float64 // when step was first reported
	heard   float64 // last report
	release float64 // end of quarantine; 0 if none
}

// Screen holds per-peer report histories. It is not safe for concurrent use.
type Screen struct {
	cfg   ScreenConfig
	peers map[string]*screenRecord
}

// NewScreen returns an empty Screen.
func NewScreen(cfg ScreenConfig) *Screen {
	if cfg.MaxPeers <= 0 {
		cfg.MaxPeers = DefaultScreenConfig().MaxPeers
	}
	return &Screen{cfg: cfg, peers: make(map[string]*screenRecord)}
}

// Len is the number of peers with a record.
func (s *Screen) Len() int { return len(s.peers) }

// Check records that peer reported step at time now and judges the report.
// interval is the asker's own recent seconds per step (0 if unknown).
func (s *Screen) Check(peer string, step Step, now, interval float64) Verdict {
	r, ok := s.peers[peer]
	if !ok || now-r.heard > s.cfg.Forget {
		if !ok {
			s.makeRoom(now)
		}
		s.peers[peer] = &screenRecord{step: step, since: now, heard: now}
		return Accept
	}
	r.heard = now
	switch {
	case step < r.step:
		// Start over from the lower step once the quarantine ends: a
		// restarted honest peer is then trusted again.
		r.step, r.since, r.release = step, now, now+s.cfg.Quarantine
		return Regressed
	case now < r.release:
		if step > r.step {
			r.step, r.since = step, now
		}
		return Quarantined
	case step > r.step:
		r.step, r.since = step, now
		return Accept
	}
	window := s.cfg.StuckMin
	if interval > 0 {
		window = s.cfg.StuckIntervals * interval
	}
	if now-r.since > window {
		return Stuck
	}
	return Accept
}

// makeRoom forgets stale records and, at the cap, the least recently heard
// peer. The scan is linear, but runs only when a new peer arrives at a full
// table.
func (s *Screen) makeRoom(now float64) {
	if len(s.peers) < s.cfg.MaxPeers {
		return
	}
	oldest, at := "", now
	for p, r := range s.peers {
		if now-r.heard > s.cfg.Forget {
			delete(s.peers, p)
			continue
		}
		if r.heard <= at {
			oldest, at = p, r.heard
		}
	}
	if len(s.peers) >= s.cfg.MaxPeers {
		delete(s.peers, oldest)
	}
}
