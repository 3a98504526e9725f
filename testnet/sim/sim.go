package sim

import (
	"container/heap"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"

	"github.com/pspnode/pspnode/psp"
)

// Mode selects how waiting nodes are re-evaluated.
type Mode int

const (
	// Fidelity re-evaluates every waiting node, with a fresh sample, at
	// every completion event: the paper's simulator.
	Fidelity Mode = iota
	// Poll has each waiting node re-check every PollInterval seconds, as a
	// real node does; for very large N.
	Poll
)

// String returns "fidelity" or "poll".
func (m Mode) String() string {
	if m == Poll {
		return "poll"
	}
	return "fidelity"
}

// ChurnMode says how leaving nodes leave.
type ChurnMode int

const (
	Crash    ChurnMode = iota // vanish without a word
	Graceful                  // announce the leave
	Mixed                     // each leave is a crash or graceful with equal odds
)

// String returns "crash", "graceful" or "mixed".
func (c ChurnMode) String() string {
	return [...]string{"crash", "graceful", "mixed"}[c]
}

// ParseChurnMode parses "crash", "graceful" or "mixed".
func ParseChurnMode(s string) (ChurnMode, error) {
	switch s {
	case "crash":
		return Crash, nil
	case "graceful":
		return Graceful, nil
	case "mixed":
		return Mixed, nil
	}
	return 0, fmt.Errorf("unknown churn mode %q: want crash, graceful or mixed", s)
}

// Config is one simulation run. Start from DefaultConfig.
type Config struct {
	Nodes    int      // initial population
	Duration float64  // simulated seconds
	Barrier  psp.Spec // barrier every node runs
	Seed     uint64   // the run is a pure function of Config

	TimeScale      float64 // multiplies every task time; 1 is the paper's model
	Stragglers     float64 // fraction of nodes that are stragglers, in [0, 1]
	StraggleFactor float64 // stragglers' task time multiplier, >= 1

	Mode         Mode
	PollInterval float64 // seconds between re-checks in Poll mode

	LeaveRate  float64   // fraction of the initial population leaving per minute
	JoinRate   float64   // fraction of the initial population joining per minute
	ChurnMode  ChurnMode // how leavers leave
	JoinSample int       // live nodes a joiner looks at to adopt a step

	RecordEvery float64 // seconds between per-node step snapshots; 0 disables the series
	StallWindow float64 // a waiting node without progress for this long counts as stalled
	LagR        int     // r of the recorded lag CDF F(r); -1 means the barrier's staleness (4 for ASP)

	// Progress, if set, is called now and then with the simulated time.
	Progress func(now float64)
}

// DefaultConfig is the PSP paper's step experiment: 200 nodes, 200 simulated
// seconds, no stragglers, pSSP with β = 10 and s = 4.
func DefaultConfig() Config {
	return Config{
		Nodes:          200,
		Duration:       200,
		Barrier:        psp.Spec{Kind: psp.PSSP, Beta: 10, Staleness: 4},
		Seed:           1,
		TimeScale:      1,
		StraggleFactor: 4,
		PollInterval:   0.25,
		ChurnMode:      Mixed,
		JoinSample:     psp.JoinSample,
		RecordEvery:    1,
		StallWindow:    30,
		LagR:           -1,
	}
}

// Validate checks a Config, with errors that name the field.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if c.Nodes < 1 || c.Nodes > 10_000_000 {
		bad("nodes %d out of range [1, 10000000]", c.Nodes)
	}
	if !(c.Duration > 0) || math.IsInf(c.Duration, 0) {
		bad("duration %v must be a positive number of seconds", c.Duration)
	}
	if err := c.Barrier.Validate(); err != nil {
		bad("barrier: %w", err)
	}
	if !(c.TimeScale > 0) || math.IsInf(c.TimeScale, 0) {
		bad("time scale %v must be positive", c.TimeScale)
	}
	if !(c.Stragglers >= 0 && c.Stragglers <= 1) {
		bad("stragglers %v must be a fraction in [0, 1]", c.Stragglers)
	}
	if !(c.StraggleFactor >= 1) || math.IsInf(c.StraggleFactor, 0) {
		bad("straggle factor %v must be >= 1", c.StraggleFactor)
	}
	if c.Mode == Poll && !(c.PollInterval > 0) {
		bad("poll interval %v must be positive", c.PollInterval)
	}
	if !(c.LeaveRate >= 0) || !(c.JoinRate >= 0) || math.IsInf(c.LeaveRate, 0) || math.IsInf(c.JoinRate, 0) {
		bad("churn rates must be non-negative (leave %v, join %v)", c.LeaveRate, c.JoinRate)
	}
	if c.RecordEvery < 0 || c.StallWindow < 0 || math.IsNaN(c.RecordEvery) || math.IsNaN(c.StallWindow) {
		bad("record interval and stall window must be non-negative")
	}
	if c.RecordEvery > 0 && c.Duration/c.RecordEvery > 1e6 {
		bad("record interval %v too small for duration %v", c.RecordEvery, c.Duration)
	}
	return errors.Join(errs...)
}

// Stats summarises a distribution.
type Stats struct {
	Min    float64 `json:"min"`
	Mean   float64 `json:"mean"`
	Max    float64 `json:"max"`
	P5     float64 `json:"p5"`
	P50    float64 `json:"p50"`
	P95    float64 `json:"p95"`
	StdDev float64 `json:"stddev"`
}

// Summarize computes Stats over xs (nearest-rank percentiles). Empty input
// gives all zeros.
func Summarize(xs []float64) Stats {
	if len(xs) == 0 {
		return Stats{}
	}
	s := slices.Clone(xs)
	sort.Float64s(s)
	var sum, sq float64
	for _, x := range s {
		sum += x
	}
	mean := sum / float64(len(s))
	for _, x := range s {
		sq += (x - mean) * (x - mean)
	}
	return Stats{
		Min: s[0], Max: s[len(s)-1], Mean: mean,
		P5: Percentile(s, 5), P50: Percentile(s, 50), P95: Percentile(s, 95),
		StdDev: math.Sqrt(sq / float64(len(s))),
	}
}

// Percentile returns the nearest-rank p-th percentile of sorted xs.
func Percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// Lag is the recorded update sequence lag and the bound beside it.
type Lag struct {
	Updates  int     `json:"updates"`  // T: updates in the sequence
	Mean     float64 `json:"mean"`     // (1/T) Σ γ_t, in steps
	MeanSq   float64 `json:"mean_sq"`  // (1/T) Σ γ_t², in steps²
	R        int     `json:"r"`        // r of F(r)
	F        float64 `json:"F_r"`      // empirical F(r)
	BoundOK  bool    `json:"bound_ok"` // whether the bound applies (probabilistic, 0 < F < 1)
	BoundMu  float64 `json:"bound_mean,omitempty"`
	BoundVar float64 `json:"bound_var,omitempty"`
}

// Result is what one run recorded.
type Result struct {
	Barrier   string  `json:"barrier"`
	Nodes     int     `json:"nodes"`
	DurationS float64 `json:"duration_s"`
	Seed      uint64  `json:"seed"`
	Mode      string  `json:"mode"`

	Steps        Stats   `json:"steps"`         // final steps of live nodes
	Live         int     `json:"live_nodes"`    // live nodes at the end
	Joined       int     `json:"joined"`        // nodes that joined by churn
	Left         int     `json:"left"`          // graceful leaves
	Crashed      int     `json:"crashed"`       // crashes
	StalledNodes int     `json:"stalled_nodes"` // live nodes waiting without progress for StallWindow
	WaitFraction float64 `json:"wait_fraction"` // share of live node-time spent waiting at barriers
	WaitS        Stats   `json:"wait_s"`        // lengths of individual barrier waits, seconds
	Checks       int     `json:"barrier_checks"`
	Lag          Lag     `json:"lag"`

	// FinalSteps holds each node's final step in node order; nodes no longer
	// live are -1. Node i's straggle factor is Factors[i].
	FinalSteps []psp.Step `json:"-"`
	Factors    []float64  `json:"-"`
	// Times and Series: Series[k][i] is node i's step at Times[k]; -1 before
	// it joined and after it left.
	Times  []float64    `json:"-"`
	Series [][]psp.Step `json:"-"`
}

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
	interval  float64 // EWMA of seconds between completions, reported to samplers
	decider   psp.Decider
	dssp      int // index in the DSSP controller
}

type evKind uint8

const (
	evComplete evKind = iota
	evPoll
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
	obs     []psp.Observation
	updates []update
	waits   []float64
	lagHits float64
	lagObs  float64
	lagR    int
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
		if cfg.Barrier.Kind == psp.ASP {
			s.lagR = 4
		}
	}
	if cfg.Barrier.Kind == psp.DSSP {
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
	if cfg.JoinRate > 0 {
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
	return (n.rng.ExpFloat64() + 1) * n.factor * s.cfg.TimeScale
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
	if s.cfg.Barrier.Kind == psp.PDSSP {
		n.decider = psp.NewDecider(s.cfg.Barrier)
	} else if s.cfg.Barrier.Kind != psp.DSSP {
		n.decider = psp.NewDecider(s.cfg.Barrier) // stateless: shared semantics
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
				s.check(e.node)
			}
		case evLeave:
			s.leave()
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
		pass = s.decide(id)
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

// decide runs the node's psp.Decider on what it observes.
func (s *sim) decide(id int) bool {
	n := s.nodes[id]
	s.res.Checks++
	s.obs = s.obs[:0]
	sp := s.cfg.Barrier
	switch {
	case sp.Kind == psp.ASP:
	case sp.Global():
		for _, o := range s.view {
			if o != id {
				m := s.nodes[o]
				s.obs = append(s.obs, psp.Observation{Peer: m.name, Step: m.step, Interval: m.interval})
			}
		}
	default:
		k := sp.SampleSize(len(s.live) - 1)
		s.idx = psp.SampleOthers(s.sample, len(s.live), s.livePos[id], k, s.idx)
		for _, p := range s.idx {
			m := s.nodes[s.live[p]]
			s.obs = append(s.obs, psp.Observation{Peer: m.name, Step: m.step, Interval: m.interval})
		}
	}
	return n.decider.Decide(n.step, s.now, s.obs).Pass
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
	for _, p := range s.idx {
		if s.nodes[s.live[p]].step >= n.step-psp.Step(s.lagR) {
			s.lagHits++
		}
	}
	s.lagObs += float64(k)
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
	if sp.Probabilistic() && sp.Beta >= 1 && T > s.lagR {
		if b, err := psp.Bound(l.F, sp.Beta, s.lagR, T); err == nil {
			l.BoundOK, l.BoundMu, l.BoundVar = true, b.Mean, b.Variance
		}
	}
	return l
}
