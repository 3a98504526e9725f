package testnet

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/gossip"
	"github.com/pspnode/pspnode/internal/memnet"
	"github.com/pspnode/pspnode/model"
	"github.com/pspnode/pspnode/node"
	"github.com/pspnode/pspnode/psp"
	"github.com/pspnode/pspnode/testnet/sim"
)

// Snapshot is the testnet's state at one moment, for live progress.
type Snapshot struct {
	Elapsed       time.Duration
	Live          int
	StepMin       int64
	StepMedian    int64
	StepMax       int64
	EstimateError float64 // median |N̂ - N| / N over live nodes, NaN if none
	UpdatesPerSec float64
	Waiting       int
	Accuracy      float64 // last evaluation (accuracy, or R² for linreg), NaN if none
}

type member struct {
	idx      int
	nd       *node.Node
	factor   float64
	role     Role
	cancel   context.CancelFunc
	done     chan struct{}
	joinedAt time.Duration // since training started (0 for initial nodes)
	leftAt   time.Duration // -1 while live
	crashed  bool
	lastStep int64
	// opened0 is the node's connections-opened count when it was launched
	// (training start, or its join), so the rate covers training only.
	opened0 uint64
	// freeSince is when the node last became free to go on at lastStep:
	// its barrier, on the true population, would let it, and it is not
	// computing. -1 while it is not free.
	freeSince time.Duration
}

// noteFree records whether the member is free to go on at now (see
// freeSince) and reports whether it has been free, without progress, for
// a whole window. (A joiner is first seen free after it joined, so the
// window also runs from its join.)
func (m *member) noteFree(now time.Duration, free bool, window time.Duration) bool {
	if !free {
		m.freeSince = -1
		return false
	}
	if m.freeSince < 0 {
		m.freeSince = now
	}
	return now-m.freeSince >= window
}

type stepRow struct {
	t    float64
	node int
	step int64
}

type estRow struct {
	t          float64
	truth      int
	median, lo float64
	hi         float64
}

type accRow struct {
	t        float64
	accuracy float64
	loss     float64
	updates  float64
}

// testnet is one run in progress.
type testnet struct {
	cfg   Config
	log   *slog.Logger
	net   *memnet.Net // nil for tcp
	data  model.Data
	rng   *rand.Rand // churn, bootstrap choice
	start time.Time

	mu      sync.Mutex
	members []*member
	sampled map[peer.ID]int // selection counts of barrier samples
	stalls  map[int]bool    // members found stalled at some point

	steps  []stepRow
	ests   []estRow
	accs   []accRow
	relErr []float64 // |N̂-N|/N of live nodes at the last record
	wg     sync.WaitGroup

	roleOf        sync.Map // peer.ID -> Role, hostile nodes only
	target        *member  // the honest node flooders attack
	poisonApplied atomic.Uint64
	normDelivered atomic.Uint64
}

// Run builds a testnet, trains for cfg.Duration with the configured churn,
// and returns what it measured. The context stops it early (the result
// covers the time run).
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("testnet: %w", err)
	}
	t := &testnet{
		cfg:     cfg,
		log:     cfg.Logger,
		rng:     rand.New(rand.NewPCG(cfg.Seed, 0x7e57)),
		sampled: make(map[peer.ID]int),
		stalls:  make(map[int]bool),
	}
	if t.log == nil {
		t.log = slog.New(slog.DiscardHandler)
	}
	if cfg.Model != "none" {
		d, err := model.Open(node.DataFor(cfg.Model, cfg.Data))
		if err != nil {
			return nil, fmt.Errorf("testnet: %w", err)
		}
		t.data = d
	}
	if cfg.Transport == "mem" {
		t.net = memnet.New(cfg.Latency)
	}
	defer t.closeAll()

	// Stragglers: exactly round(F·N) initial nodes, chosen by the seed.
	pick := rand.New(rand.NewPCG(cfg.Seed, 0x57a6))
	straggler := make([]bool, cfg.Nodes)
	for _, i := range pick.Perm(cfg.Nodes)[:int(math.Round(cfg.Stragglers*float64(cfg.Nodes)))] {
		straggler[i] = true
	}
	roles := assignRoles(cfg.Nodes, cfg.Roles, cfg.Seed)
	buildStart := time.Now()
	for i := range cfg.Nodes {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		f := 1.0
		if straggler[i] {
			f = cfg.StraggleFactor
		}
		m, err := t.addNode(ctx, f, false, roles[i])
		if err != nil {
			return nil, fmt.Errorf("testnet: node %d: %w", i, err)
		}
		if t.target == nil && m.role == Honest {
			t.target = m
		}
		if cfg.BuildProgress != nil && ((i+1)%50 == 0 || i+1 == cfg.Nodes) {
			cfg.BuildProgress(i+1, cfg.Nodes, time.Since(buildStart))
		}
	}
	t.waitWarm(ctx)
	warm := time.Since(buildStart)

	// Training starts for everyone at once, as in the simulator.
	runCtx, stop := context.WithTimeout(ctx, cfg.Duration)
	defer stop()
	t.start = time.Now()
	t.mu.Lock()
	for _, m := range t.members {
		t.launch(runCtx, m)
	}
	t.mu.Unlock()

	var bg sync.WaitGroup
	bg.Go(func() { t.recordLoop(runCtx) })
	bg.Go(func() { t.churnLoop(runCtx) })
	if cfg.EvalEvery > 0 && cfg.Model != "none" {
		bg.Go(func() { t.evalLoop(runCtx) })
	}
	<-runCtx.Done()
	bg.Wait()
	elapsed := time.Since(t.start)
	t.record(elapsed) // final snapshot, before nodes stop
	if cfg.Model != "none" {
		t.evaluate(elapsed)
	}
	res := t.result(elapsed, warm)
	// Stop every node, then wait for their loops.
	t.mu.Lock()
	for _, m := range t.members {
		if m.leftAt < 0 {
			m.cancel()
		}
	}
	t.mu.Unlock()
	t.wg.Wait()
	return res, nil
}

// addNode creates a node (not yet training) bootstrapped from up to three
// random live members.
func (t *testnet) addNode(ctx context.Context, factor float64, joining bool, role Role) (*member, error) {
	cfg := node.DefaultConfig()
	cfg.Job = "testnet"
	cfg.Barrier = t.cfg.Barrier
	cfg.Logger = t.log
	cfg.EvalEvery = 0
	cfg.JoinFetch = joining
	cfg.QueryTimeout = 2 * time.Second
	cfg.Overlay.Logger = t.log
	cfg.Gossip.Logger = t.log
	if enc, err := gossip.ParseEncoding(t.cfg.Encoding); err == nil {
		cfg.Gossip.Encoding = enc
	} else {
		return nil, err
	}
	cfg.Gossip.PeerScoring = true
	cfg.PollShare = t.cfg.PollShare
	if t.cfg.NoScreen {
		cfg.Screen = psp.ScreenConfig{}
	}
	switch {
	case t.cfg.NormBound > 0:
		cfg.NormBound = t.cfg.NormBound
	case t.cfg.NormBound < 0:
		cfg.NormBound = 0
	}
	cfg.ConnLow, cfg.ConnHigh, cfg.Overlay.PoolSize = t.cfg.Limits()
	// Background overlay work grows with N: past overlay.SharedMachineNodes
	// the overlay's periods stretch in proportion, so the testnet's total
	// background load stays that of that many nodes.
	cfg.Overlay = cfg.Overlay.ForSharedMachine(t.cfg.Nodes)
	t.mu.Lock()
	idx := len(t.members)
	live := t.liveLocked()
	t.mu.Unlock()
	for _, j := range t.rng.Perm(len(live))[:min(3, len(live))] {
		for _, a := range live[j].nd.Addrs() {
			cfg.Bootstrap = append(cfg.Bootstrap, a.String())
			break
		}
	}
	if t.net != nil {
		h, err := t.net.NewHost(cfg.ConnLow, cfg.ConnHigh)
		if err != nil {
			return nil, err
		}
		cfg.Host = h
	} else {
		cfg.Listen = []string{"/ip4/127.0.0.1/tcp/0"}
	}
	cfg.Seed = t.cfg.Seed*1_000_003 + uint64(idx) + 1
	cfg.OnSample = t.countSample
	spec := node.TaskSpec{
		Model: t.cfg.Model, Shard: idx % t.cfg.Nodes, Shards: t.cfg.Nodes,
		SGD:  model.DefaultSGDConfig(),
		Time: node.TimeModel{Scale: t.cfg.TimeScale, Factor: factor},
		Seed: cfg.Seed, InitSeed: node.SeedOf(cfg.Job),
	}
	if t.cfg.LR > 0 {
		spec.SGD.LR0 = t.cfg.LR
	}
	task, err := node.NewTask(spec, t.data)
	if err != nil {
		if cfg.Host != nil {
			_ = cfg.Host.Close()
		}
		return nil, err
	}
	cfg.Task = task
	var self peer.ID
	cfg.Faults = t.faults(role, cfg.Seed, &self, task.NumParams(), task.ModelID())
	nd, err := node.New(ctx, cfg)
	if err != nil {
		return nil, err
	}
	self = nd.ID()
	m := &member{idx: idx, nd: nd, factor: factor, role: role, leftAt: -1, freeSince: -1, done: make(chan struct{})}
	if role != Honest {
		t.roleOf.Store(self, role)
	} else if g := nd.Gossip(); g != nil && len(t.cfg.Roles) > 0 {
		// Count what honest nodes receive from poisoners.
		g.Subscribe(func(u gossip.Update) {
			r, ok := t.roleOf.Load(u.Sender)
			switch {
			case !ok:
			case r.(Role).invalidPoison():
				t.poisonApplied.Add(1)
			case r.(Role) == PoisonNorm:
				t.normDelivered.Add(1)
			}
		})
	}
	if joining {
		m.joinedAt = time.Since(t.start)
	}
	t.mu.Lock()
	t.members = append(t.members, m)
	t.mu.Unlock()
	return m, nil
}

func (t *testnet) liveLocked() []*member {
	var out []*member
	for _, m := range t.members {
		if m.leftAt < 0 {
			out = append(out, m)
		}
	}
	return out
}

func (t *testnet) countSample(peers []peer.ID) {
	t.mu.Lock()
	for _, p := range peers {
		t.sampled[p]++
	}
	t.mu.Unlock()
}

// launch starts a member's training loop. t.mu must be held.
func (t *testnet) launch(ctx context.Context, m *member) {
	c, cancel := context.WithCancel(ctx)
	m.cancel = cancel
	m.opened0 = m.nd.Status().ConnectionsOpened
	t.wg.Go(func() {
		defer close(m.done)
		if err := m.nd.Run(c); err != nil {
			t.log.Warn("node failed", "node", m.idx, "err", err)
		}
	})
	if m.role == Flooder && t.target != nil {
		target := t.target.nd.ID()
		t.wg.Go(func() { t.flood(c, m, target) })
	}
}

// waitWarm waits until every node's overlay knows most of the others (or
// the warm-up time passes), so training starts on a formed network.
func (t *testnet) waitWarm(ctx context.Context) {
	deadline := time.Now().Add(t.cfg.Warmup)
	want := min(t.cfg.Nodes-1, 2*t.cfg.Barrier.Beta+4)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		ready := 0
		t.mu.Lock()
		for _, m := range t.members {
			if len(m.nd.Overlay().Peers()) >= want {
				ready++
			}
		}
		n := len(t.members)
		t.mu.Unlock()
		if ready == n {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (t *testnet) closeAll() {
	t.mu.Lock()
	ms := slices.Clone(t.members)
	t.mu.Unlock()
	var wg sync.WaitGroup
	for _, m := range ms {
		wg.Go(func() { _ = m.nd.Crash() })
	}
	wg.Wait()
	if t.net != nil {
		_ = t.net.Close()
	}
}

// record takes one snapshot of every live node.
func (t *testnet) record(now time.Duration) Snapshot {
	t.mu.Lock()
	defer t.mu.Unlock()
	live := t.liveLocked()
	truth := float64(len(live))
	snap := Snapshot{Elapsed: now, Live: len(live), EstimateError: math.NaN(), Accuracy: math.NaN()}
	var steps []int64
	var rel []float64
	sec := now.Seconds()
	for _, m := range live {
		s := m.nd.Step()
		if s != m.lastStep {
			m.lastStep, m.freeSince = s, -1
		}
		steps = append(steps, s)
		t.steps = append(t.steps, stepRow{sec, m.idx, s})
		if m.nd.Waiting() {
			snap.Waiting++
		}
		if est, _, err := m.nd.Overlay().Estimate(); err == nil {
			rel = append(rel, math.Abs(est-truth)/truth)
		} else {
			rel = append(rel, 1) // no estimate counts as 100 % off
		}
	}
	// Stalled: no progress for StallWindow while the node was free to go
	// on: its barrier, evaluated on the true live population, would have
	// let it all along, and it was not busy computing its own step (a
	// straggler's long step is not a stall).
	minStep := slices.Min(append(steps, math.MaxInt64))
	s := t.cfg.Barrier.BaseStaleness()
	for _, m := range live {
		free := (s < 0 || minStep >= m.lastStep-int64(s)) && !m.nd.Computing()
		if m.noteFree(now, free, t.cfg.StallWindow) {
			t.stalls[m.idx] = true
		}
	}
	if len(steps) > 0 {
		slices.Sort(steps)
		snap.StepMin, snap.StepMedian, snap.StepMax = steps[0], steps[(len(steps)-1)/2], steps[len(steps)-1]
	}
	if len(rel) > 0 {
		sorted := slices.Clone(rel)
		slices.Sort(sorted)
		snap.EstimateError = sorted[(len(sorted)-1)/2]
		t.ests = append(t.ests, estRow{t: sec, truth: len(live), median: sim.Percentile(sorted, 50), lo: sim.Percentile(sorted, 5), hi: sim.Percentile(sorted, 95)})
	}
	t.relErr = rel
	if len(t.accs) > 0 {
		snap.Accuracy = t.accs[len(t.accs)-1].accuracy
	}
	return snap
}

func (t *testnet) recordLoop(ctx context.Context) {
	tick := time.NewTicker(t.cfg.RecordEvery)
	defer tick.Stop()
	var lastUpdates uint64
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		snap := t.record(time.Since(t.start))
		u := t.updatesReceived()
		snap.UpdatesPerSec = float64(u-lastUpdates) / t.cfg.RecordEvery.Seconds()
		lastUpdates = u
		if t.cfg.Progress != nil {
			t.cfg.Progress(snap)
		}
	}
}

func (t *testnet) updatesReceived() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	var n uint64
	for _, m := range t.members {
		if g := m.nd.Gossip(); g != nil {
			n += g.Stats().Received
		}
	}
	return n
}

// churnLoop replaces cfg.Churn of the initial nodes per minute (a leave
// and a join, each a Poisson process) and plays the churn script.
func (t *testnet) churnLoop(ctx context.Context) {
	rate := t.cfg.Churn * float64(t.cfg.Nodes) / 60 // events per second, each kind
	next := func() time.Duration {
		if rate <= 0 {
			return time.Duration(math.MaxInt64)
		}
		return time.Duration(t.rng.ExpFloat64() / rate * float64(time.Second))
	}
	elapsed := func() time.Duration { return time.Since(t.start) }
	nextLeave, nextJoin := next(), next()
	script := slices.Clone(t.cfg.Script)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		now := elapsed()
		for now >= nextLeave {
			mode := t.cfg.ChurnMode
			crash := mode == sim.Crash || (mode == sim.Mixed && t.rng.IntN(2) == 0)
			t.remove(1, crash)
			nextLeave += next()
		}
		for now >= nextJoin {
			t.join(ctx, 1)
			nextJoin += next()
		}
		for len(script) > 0 && script[0].At <= now {
			ev := script[0]
			script = script[1:]
			n := ev.Count
			if ev.Fraction > 0 {
				t.mu.Lock()
				n = int(math.Round(ev.Fraction * float64(len(t.liveLocked()))))
				t.mu.Unlock()
			}
			t.log.Info("churn script", "event", ev.String(), "nodes", n)
			switch ev.Action {
			case Join:
				t.join(ctx, n)
			case Leave:
				t.remove(n, false)
			case Crash:
				t.remove(n, true)
			case Partition:
				t.partition(n)
			case Heal:
				if t.net != nil {
					t.net.Heal()
				}
			}
		}
	}
}

// remove stops n random live nodes, all at once.
func (t *testnet) remove(n int, crash bool) {
	t.mu.Lock()
	live := t.liveLocked()
	if len(live) <= 2 {
		t.mu.Unlock()
		return
	}
	n = min(n, len(live)-2) // keep a network
	now := time.Since(t.start)
	var victims []*member
	for _, j := range t.rng.Perm(len(live))[:n] {
		m := live[j]
		m.leftAt, m.crashed = now, crash
		victims = append(victims, m)
	}
	t.mu.Unlock()
	var wg sync.WaitGroup
	for _, m := range victims {
		wg.Go(func() {
			if m.cancel != nil {
				m.cancel()
			}
			if crash {
				_ = m.nd.Crash()
			} else {
				<-m.done // finish or abandon the step, then say goodbye
				_ = m.nd.Close()
			}
		})
	}
	wg.Wait()
}

// partition cuts the network in two: n random live nodes on one side, the
// rest (and later joiners) on the other.
func (t *testnet) partition(n int) {
	if t.net == nil {
		return
	}
	t.mu.Lock()
	live := t.liveLocked()
	side := make(map[peer.ID]int, n)
	for _, j := range t.rng.Perm(len(live))[:min(n, len(live))] {
		side[live[j].nd.ID()] = 1
	}
	t.mu.Unlock()
	t.net.Partition(func(p peer.ID) int { return side[p] })
}

// join adds n nodes that join the running job.
func (t *testnet) join(ctx context.Context, n int) {
	for range n {
		m, err := t.addNode(ctx, 1, true, Honest)
		if err != nil {
			t.log.Warn("join failed", "err", err)
			continue
		}
		t.mu.Lock()
		t.launch(ctx, m)
		t.mu.Unlock()
	}
}

func (t *testnet) evalLoop(ctx context.Context) {
	tick := time.NewTicker(t.cfg.EvalEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			t.evaluate(time.Since(t.start))
		}
	}
}

// metric names what Accuracy measures for the configured model.
func (t *testnet) metric() string {
	if t.cfg.Model == "linreg" {
		return "r2"
	}
	return "accuracy"
}

// evaluate scores the models of up to three random live nodes on the
// held-out data and records their mean.
func (t *testnet) evaluate(now time.Duration) {
	t.mu.Lock()
	live := t.liveLocked()
	var pick []*member
	for _, j := range t.rng.Perm(len(live))[:min(3, len(live))] {
		pick = append(pick, live[j])
	}
	var updates float64
	for _, m := range t.members {
		if g := m.nd.Gossip(); g != nil {
			updates += float64(g.Stats().Sent)
		}
	}
	t.mu.Unlock()
	var acc, loss float64
	k := 0
	for _, m := range pick {
		ev, ok := m.nd.Task().(node.Evaluator)
		if !ok {
			continue
		}
		r, err := ev.Evaluate()
		if err != nil {
			continue
		}
		if t.cfg.Model == "linreg" {
			acc += r.R2
		} else {
			acc += r.Accuracy
		}
		loss += r.Loss
		k++
	}
	if k == 0 {
		return
	}
	t.mu.Lock()
	t.accs = append(t.accs, accRow{t: now.Seconds(), accuracy: acc / float64(k), loss: loss / float64(k), updates: updates})
	t.mu.Unlock()
}
