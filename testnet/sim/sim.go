package sim

import (
	"container/heap"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"

	"github.com/pspnode/pspnode/psp"
)

type node struct {
	name      string
	step      psp.Step
	factor    float64
	rng       *rand.Rand // task times
	alive     bool
	inView    bool // in the global view (crashed nodes stay)
	waiting   bool
	waitFrom  float64
	waitTotal float64
	joinedAt  float64
	progress  float64 // last time it completed an iteration or joined
	lastDone  float64
	interval  float64      // EWMA of seconds between completions, reported to samplers
	checker   *psp.Checker // the nodes' barrier policy (psp.Checker); nil under the DSSP controller
	dssp      int          // index in the DSSP controller
	compute   float64      // EWMA of its task times: its Checker's c (Timed)
	wakeAt    float64      // Timed: when its Checker wants its next tick
	pollAt    float64      // Timed: the poll event that is not stale
	waiters   []waiter     // Timed: peers this node holds back
}

// waiter is a peer whose barrier this node holds back until its step
// reaches threshold (node/progress.go's waiters).
type waiter struct {
	id        int
	threshold psp.Step
}

type evKind uint8

const (
	evComplete evKind = iota
	evPoll
	evWake
	evLeave
	evJoin
	evRecord
)

type event struct {
	t    float64
	seq  uint64 // tie-break: deterministic FIFO
	kind evKind
	node int
}

type queue []event

func (q queue) Len() int { return len(q) }
func (q queue) Less(i, j int) bool {
	if q[i].t != q[j].t {
		return q[i].t < q[j].t
	}
	return q[i].seq < q[j].seq
}
func (q queue) Swap(i, j int)     { q[i], q[j] = q[j], q[i] }
func (q *queue) Push(x any)       { *q = append(*q, x.(event)) }
func (q *queue) Pop() any         { old := *q; e := old[len(old)-1]; *q = old[:len(old)-1]; return e }
func (q *queue) add(e event)      { heap.Push(q, e) }
func (q *queue) next() event      { return heap.Pop(q).(event) }
func (q queue) peekTime() float64 { return q[0].t }

type update struct {
	step psp.Step
	t    float64
}

type sim struct {
	cfg     Config
	now     float64
	seq     uint64
	q       queue
	nodes   []*node
	live    []int // live node ids
	livePos map[int]int
	view    []int // global view: node ids (live and crashed)
	waiting []int // waiting node ids, fidelity mode
	sample  *rand.Rand
	churn   *rand.Rand
	ctrl    *psp.DSSPController
	idx     []int
	drawn   []string    // a check's draw, by node name
	known   []psp.Known // a global check's view
	asks    []string    // queries of a check not answered yet
	updates []update
	waits   []float64
	lagHits float64
	lagObs  float64
	lagR    int
	stale   [2][]float64 // with stragglers: each completion's staleness, fast nodes' and stragglers'
	scratch []psp.Step
	res     Result
}

// Run simulates one configuration.
func Run(cfg Config) (*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	s := &sim{
		cfg:     cfg,
		livePos: make(map[int]int, cfg.Nodes),
		sample:  rand.New(rand.NewPCG(cfg.Seed, 0x5a3c1e)),
		churn:   rand.New(rand.NewPCG(cfg.Seed, 0xc4a11)),
	}
	s.lagR = cfg.LagR
	if s.lagR < 0 {
		s.lagR = max(cfg.Barrier.BaseStaleness(), 0)
		if cfg.Barrier.BaseStaleness() < 0 { // no bound (ASP): the paper's r
			s.lagR = 4
		}
	}
	if server(cfg.Barrier) {
		s.ctrl = psp.NewDSSPController(0, cfg.Barrier.Staleness, cfg.Barrier.Upper)
	}
	// Stragglers: exactly round(F·N) nodes, chosen by the seed.
	pick := rand.New(rand.NewPCG(cfg.Seed, 0x57a6))
	straggler := make([]bool, cfg.Nodes)
	for _, i := range pick.Perm(cfg.Nodes)[:int(math.Round(cfg.Stragglers*float64(cfg.Nodes)))] {
		straggler[i] = true
	}
	for i := range cfg.Nodes {
		f := 1.0
		if straggler[i] {
			f = cfg.StraggleFactor
		}
		s.addNode(0, f)
	}
	if cfg.LeaveRate > 0 {
		s.schedule(s.churnGap(cfg.LeaveRate), evLeave, -1)
	}
	if cfg.JoinRate > 0 && !cfg.Replace {
		s.schedule(s.churnGap(cfg.JoinRate), evJoin, -1)
	}
	if cfg.RecordEvery > 0 {
		s.schedule(0, evRecord, -1)
	}
	s.loop()
	s.finish()
	return &s.res, nil
}

func (s *sim) schedule(t float64, k evKind, n int) {
	s.seq++
	s.q.add(event{t: t, seq: s.seq, kind: k, node: n})
}

func (s *sim) churnGap(ratePerMin float64) float64 {
	perSec := ratePerMin * float64(s.cfg.Nodes) / 60
	return s.now + s.churn.ExpFloat64()/perSec
}

func (s *sim) taskTime(n *node) float64 {
	t := (n.rng.ExpFloat64() + 1) * n.factor * s.cfg.TimeScale
	if n.compute == 0 {
		n.compute = t
	} else {
		n.compute = 0.3*t + 0.7*n.compute
	}
	return t
}

func (s *sim) addNode(step psp.Step, factor float64) int {
	id := len(s.nodes)
	n := &node{
		name:   strconv.Itoa(id),
		step:   step,
		factor: factor,
		rng:    rand.New(rand.NewPCG(s.cfg.Seed, uint64(id)+1)),
		alive:  true, inView: true,
		joinedAt: s.now, progress: s.now, lastDone: s.now,
	}
	if !server(s.cfg.Barrier) {
		n.checker = psp.NewChecker(psp.CheckConfig{Spec: s.cfg.Barrier, Replacements: 2, GlobalQueries: 32, Timing: psp.DefaultTimingConfig(), Pace: s.cfg.Pace}, nil)
	}
	if s.ctrl != nil {
		n.dssp = s.ctrl.Join(step, s.now)
	}
	s.nodes = append(s.nodes, n)
	s.livePos[id] = len(s.live)
	s.live = append(s.live, id)
	s.view = append(s.view, id)
	s.schedule(s.now+s.taskTime(n), evComplete, id)
	return id
}

func (s *sim) loop() {
	events := 0
	for s.q.Len() > 0 && s.q.peekTime() <= s.cfg.Duration {
		e := s.q.next()
		s.now = e.t
		switch e.kind {
		case evComplete:
			s.complete(e.node)
		case evPoll:
			if n := s.nodes[e.node]; n.alive && n.waiting {
				if s.cfg.Mode != Timed {
					s.check(e.node)
				} else if e.t == n.pollAt {
					n.pollAt = -1 // consumed: a later tick may be scheduled
					n.checker.Tick(s.now)
					s.timed(e.node)
				}
			}
		case evWake:
			if n := s.nodes[e.node]; n.alive && n.waiting {
				n.checker.Woken(s.now)
				s.timed(e.node)
			}
		case evLeave:
			s.leave()
			if s.cfg.Replace {
				s.join()
			}
			s.schedule(s.churnGap(s.cfg.LeaveRate), evLeave, -1)
		case evJoin:
			s.join()
			s.schedule(s.churnGap(s.cfg.JoinRate), evJoin, -1)
		case evRecord:
			s.record()
			if next := s.now + s.cfg.RecordEvery; next <= s.cfg.Duration+1e-9 {
				s.schedule(next, evRecord, -1)
			}
		}
		events++
		if s.cfg.Progress != nil && events%4096 == 0 {
			s.cfg.Progress(s.now)
		}
	}
	s.now = s.cfg.Duration
}

func (s *sim) complete(id int) {
	n := s.nodes[id]
	if !n.alive {
		return
	}
	n.step++
	n.progress = s.now
	if iv := s.now - n.lastDone; n.interval == 0 {
		n.interval = iv
	} else {
		n.interval = 0.3*iv + 0.7*n.interval
	}
	n.lastDone = s.now
	s.updates = append(s.updates, update{step: n.step, t: s.now})
	s.observeLag(id)
	if s.cfg.Mode == Timed {
		s.release(id)
	}
	if s.ctrl != nil {
		s.res.Checks++
		if s.ctrl.Push(n.dssp, s.now).Pass {
			s.start(id)
		} else {
			s.block(id)
		}
	} else if s.decide(id) {
		s.start(id)
	} else {
		s.block(id)
	}
	if s.cfg.Mode == Fidelity {
		// Re-evaluate every other waiting node with a fresh sample.
		for i := 0; i < len(s.waiting); {
			w := s.waiting[i]
			if w != id && s.check(w) {
				continue // s.waiting[i] was replaced by the last element
			}
			i++
		}
	}
}

// check re-evaluates a waiting node; it reports whether the node started.
func (s *sim) check(id int) bool {
	var pass bool
	if s.ctrl != nil {
		s.res.Checks++
		pass = s.ctrl.Retry(s.nodes[id].dssp).Pass
	} else {
		pass = s.recheck(id)
	}
	if pass {
		s.start(id)
		return true
	}
	if s.cfg.Mode == Poll {
		s.schedule(s.now+s.cfg.PollInterval*(0.5+s.sample.Float64()), evPoll, id)
	}
	return false
}

// decide starts the barrier of a node that completed a step: the nodes'
// own barrier policy (psp.Checker) runs its first check.
func (s *sim) decide(id int) bool {
	n := s.nodes[id]
	n.checker.Start(psp.CheckStart{Self: n.step, Population: float64(len(s.live)), Compute: n.compute, Interval: n.interval, Now: s.now})
	pass, _ := s.drive(id)
	return pass
}

// recheck runs a waiting node's next check now.
func (s *sim) recheck(id int) bool {
	s.nodes[id].checker.Recheck(s.now)
	pass, _ := s.drive(id)
	return pass
}

// timed carries on a waiting node's barrier after a tick or a wake
// (Timed): the check its Checker began, if it began one, and the next
// tick.
func (s *sim) timed(id int) {
	if pass, _ := s.drive(id); pass {
		s.start(id)
		return
	}
	s.schedulePoll(id)
}

// schedulePoll schedules the tick a waiting node's Checker wants (Timed).
// A poll event whose time is no longer the node's pollAt is stale.
func (s *sim) schedulePoll(id int) {
	n := s.nodes[id]
	if n.wakeAt > 0 && n.wakeAt != n.pollAt {
		n.pollAt = n.wakeAt
		s.schedule(n.wakeAt, evPoll, id)
	}
}

// drive carries out the check a node's Checker has begun, if any, as it
// says: it draws the sample uniformly from the live nodes, lists the
// global view with every node's step, and answers each query at once with
// the peer's step (the simulator models neither round trips nor failed
// queries, so a check never hedges or replaces a peer). It reports whether
// a check ran and whether it passed.
func (s *sim) drive(id int) (pass, began bool) {
	n := s.nodes[id]
	ck := n.checker
	queue, head := s.asks[:0], 0
	for {
		rd := ck.Ready()
		queue = append(queue, rd.Ask...)
		switch {
		case rd.Done:
			s.res.Checks++
			s.res.ExcusedSlow += rd.Stats.Slow
			s.res.ExcusedFar += rd.Stats.Far
			n.wakeAt = rd.Wake
			if s.cfg.Mode == Timed {
				for _, p := range queue[head:] { // sent before the check ended
					s.asked(id, p)
				}
			}
			s.asks = queue[:0]
			return rd.Pass, true
		case rd.Draw > 0:
			k := min(rd.Draw, max(len(s.live)-1, 0))
			s.idx = psp.SampleOthers(s.sample, len(s.live), s.livePos[id], k, s.idx)
			s.drawn = s.drawn[:0]
			for _, p := range s.idx {
				s.drawn = append(s.drawn, s.nodes[s.live[p]].name)
			}
			ck.Drawn(s.drawn, false, s.now)
		case rd.Known:
			// Under a static barrier every peer at or past the threshold
			// counts the same (it neither holds the node back nor gets
			// asked), so one such peer stands for them all: the decision,
			// the queries and their order are those of the whole view, at
			// the cost of the peers behind.
			s.known = s.known[:0]
			static := !s.cfg.Barrier.Dynamic()
			threshold := n.step - psp.Step(s.cfg.Barrier.BaseStaleness())
			ahead := false
			for _, o := range s.view {
				if o == id {
					continue
				}
				m := s.nodes[o]
				if static && m.step >= threshold {
					if ahead {
						continue
					}
					ahead = true
				}
				s.known = append(s.known, psp.Known{Peer: m.name, Step: m.step, Seen: true})
			}
			ck.Known(s.known, false, s.now)
		case head < len(queue):
			p := queue[head]
			head++
			m := s.asked(id, p)
			ck.Answer(p, psp.Observation{Peer: p, Step: m.step, Interval: m.interval}, true, s.now)
		default: // no check in progress: the Checker waits for its tick
			n.wakeAt = rd.Wake
			s.asks = queue[:0]
			return false, false
		}
	}
}

// asked is node id's query reaching the node named p, which it returns.
// In Timed mode the query has the effects it has on a real node
// (node/progress.go): p notes the asker as a waiter if p holds it back,
// and a query from a peer at or behind p wakes p.
func (s *sim) asked(id int, p string) *node {
	j, err := strconv.Atoi(p)
	if err != nil {
		panic(fmt.Sprintf("sim: peer %q is no node", p))
	}
	m := s.nodes[j]
	if s.cfg.Mode != Timed {
		return m
	}
	n := s.nodes[id]
	if st := s.cfg.Barrier.BaseStaleness(); st >= 0 {
		if th := n.step - psp.Step(st); m.step < th {
			i := slices.IndexFunc(m.waiters, func(w waiter) bool { return w.id == id })
			if i < 0 {
				m.waiters = append(m.waiters, waiter{id, th})
			} else {
				m.waiters[i].threshold = max(m.waiters[i].threshold, th)
			}
		}
	}
	if n.step <= m.step && m.alive && m.waiting {
		s.schedule(s.now, evWake, j)
	}
	return m
}

// release wakes the waiters that node id's new step lets pass (Timed).
func (s *sim) release(id int) {
	n := s.nodes[id]
	kept := n.waiters[:0]
	for _, w := range n.waiters {
		if n.step < w.threshold {
			kept = append(kept, w)
			continue
		}
		if m := s.nodes[w.id]; m.alive && m.waiting {
			s.schedule(s.now, evWake, w.id)
		}
	}
	n.waiters = kept
}

func (s *sim) start(id int) {
	n := s.nodes[id]
	if n.waiting {
		n.waiting = false
		w := s.now - n.waitFrom
		n.waitTotal += w
		s.waits = append(s.waits, w)
		s.unwait(id)
	}
	s.schedule(s.now+s.taskTime(n), evComplete, id)
}

func (s *sim) block(id int) {
	n := s.nodes[id]
	n.waiting, n.waitFrom = true, s.now
	if s.cfg.Mode == Fidelity {
		s.waiting = append(s.waiting, id)
	} else if s.cfg.Mode == Timed {
		s.schedulePoll(id)
	} else {
		s.schedule(s.now+s.cfg.PollInterval*(0.5+s.sample.Float64()), evPoll, id)
	}
}

func (s *sim) unwait(id int) {
	if s.cfg.Mode != Fidelity {
		return
	}
	if i := slices.Index(s.waiting, id); i >= 0 {
		s.waiting[i] = s.waiting[len(s.waiting)-1]
		s.waiting = s.waiting[:len(s.waiting)-1]
	}
}

func (s *sim) observeLag(id int) {
	n := s.nodes[id]
	k := min(16, len(s.live)-1)
	s.idx = psp.SampleOthers(s.sample, len(s.live), s.livePos[id], k, s.idx)
	s.scratch = s.scratch[:0]
	for _, p := range s.idx {
		m := s.nodes[s.live[p]].step
		if m >= n.step-psp.Step(s.lagR) {
			s.lagHits++
		}
		s.scratch = append(s.scratch, m)
	}
	s.lagObs += float64(k)
	if s.cfg.Stragglers > 0 && k > 0 {
		// The staleness of this step: how far the job (the median of the
		// sampled peers) is ahead of it, as a peer that merged it would
		// count.
		class := 0
		if n.factor > 1 {
			class = 1
		}
		s.stale[class] = append(s.stale[class], float64(max(0, psp.JoinStep(s.scratch)-n.step)))
	}
}

func (s *sim) leave() {
	if len(s.live) == 0 {
		return
	}
	id := s.live[s.churn.IntN(len(s.live))]
	n := s.nodes[id]
	graceful := s.cfg.ChurnMode == Graceful || (s.cfg.ChurnMode == Mixed && s.churn.IntN(2) == 0)
	if n.waiting {
		n.waitTotal += s.now - n.waitFrom
		n.waiting = false
		s.unwait(id)
	}
	n.alive = false
	last := s.live[len(s.live)-1]
	s.live[s.livePos[id]] = last
	s.livePos[last] = s.livePos[id]
	s.live = s.live[:len(s.live)-1]
	delete(s.livePos, id)
	if graceful {
		s.res.Left++
		n.inView = false
		if i := slices.Index(s.view, id); i >= 0 {
			s.view = slices.Delete(s.view, i, i+1)
		}
		if s.ctrl != nil {
			s.ctrl.Leave(n.dssp)
		}
	} else {
		s.res.Crashed++
	}
	// A graceful leave may release waiters of the global barriers.
	if graceful && s.cfg.Mode == Fidelity {
		for i := 0; i < len(s.waiting); {
			if s.check(s.waiting[i]) {
				continue
			}
			i++
		}
	}
}

func (s *sim) join() {
	var seen []psp.Step
	s.idx = psp.SampleIndices(s.sample, len(s.live), s.cfg.JoinSample, s.idx)
	for _, p := range s.idx {
		seen = append(seen, s.nodes[s.live[p]].step)
	}
	s.res.Joined++
	s.addNode(psp.JoinStep(seen), 1)
}

func (s *sim) record() {
	row := make([]psp.Step, len(s.nodes))
	for i, n := range s.nodes {
		row[i] = -1
		if n.alive {
			row[i] = n.step
		}
	}
	s.res.Times = append(s.res.Times, s.now)
	s.res.Series = append(s.res.Series, row)
}

func (s *sim) finish() {
	cfg := s.cfg
	r := &s.res
	r.Barrier, r.Nodes, r.DurationS, r.Seed, r.Mode = cfg.Barrier.String(), cfg.Nodes, cfg.Duration, cfg.Seed, cfg.Mode.String()
	var final []float64
	var liveTime, waitTime float64
	r.FinalSteps = make([]psp.Step, len(s.nodes))
	r.Factors = make([]float64, len(s.nodes))
	for i, n := range s.nodes {
		r.Factors[i] = n.factor
		r.FinalSteps[i] = -1
		if !n.alive {
			continue
		}
		r.FinalSteps[i] = n.step
		final = append(final, float64(n.step))
		wt := n.waitTotal
		if n.waiting {
			wt += s.now - n.waitFrom
			if s.now-n.progress >= cfg.StallWindow && cfg.StallWindow > 0 {
				r.StalledNodes++
			}
		}
		liveTime += s.now - n.joinedAt
		waitTime += wt
	}
	r.Live = len(final)
	r.Steps = Summarize(final)
	if liveTime > 0 {
		r.WaitFraction = waitTime / liveTime
	}
	r.WaitS = Summarize(s.waits)
	r.Lag = s.lag()
	if cfg.Stragglers > 0 {
		var fast, slow []float64
		for i, n := range s.nodes {
			if n.alive && n.factor > 1 {
				slow = append(slow, float64(r.FinalSteps[i]))
			} else if n.alive {
				fast = append(fast, float64(r.FinalSteps[i]))
			}
		}
		r.Stragglers = &StragglerStats{
			FastSteps: Summarize(fast), StragglerSteps: Summarize(slow),
			FastStaleness: Summarize(s.stale[0]), StragglerStaleness: Summarize(s.stale[1]),
		}
	}
}

func (s *sim) lag() Lag {
	T := len(s.updates)
	l := Lag{Updates: T, R: s.lagR}
	if s.lagObs > 0 {
		l.F = s.lagHits / s.lagObs
	}
	if T == 0 {
		return l
	}
	order := make([]int, T)
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return s.updates[order[a]].step < s.updates[order[b]].step })
	P := float64(s.cfg.Nodes)
	for tau, t := range order {
		g := math.Abs(float64(t-tau)) / P
		l.Mean += g
		l.MeanSq += g * g
	}
	l.Mean /= float64(T)
	l.MeanSq /= float64(T)
	sp := s.cfg.Barrier
	if beta := sp.BetaFor(float64(len(s.live))); sp.Probabilistic() && beta >= 1 && T > s.lagR {
		if b, err := psp.Bound(l.F, beta, s.lagR, T); err == nil {
			l.BoundOK, l.BoundMu, l.BoundVar = true, b.Mean, b.Variance
		}
	}
	return l
}
