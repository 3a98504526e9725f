// Run: build, warm up, train, record, report. The package doc, what a
// testnet is and where to start reading, is in doc.go.

package testnet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/internal/builtin"
	"github.com/pspnode/pspnode/internal/memnet"
	"github.com/pspnode/pspnode/internal/procstat"
	"github.com/pspnode/pspnode/internal/vclock"
	"github.com/pspnode/pspnode/model"
	"github.com/pspnode/pspnode/testnet/hostile"
	"github.com/pspnode/pspnode/testnet/netns"
	"github.com/pspnode/pspnode/testnet/plan"
	"github.com/pspnode/pspnode/testnet/report"
)

// testnet is one run in progress.
type testnet struct {
	cfg   plan.Config
	log   *slog.Logger
	net   *memnet.Net // nil for tcp
	data  model.Data
	keys  io.Reader     // tcp host keys (memnet.KeySource); guarded by mu
	start time.Time     // training start, on the run's clock
	wall0 time.Duration // wall time at training start (see wall)
	cpu0  time.Duration // the process's CPU time when Run began

	// sampledMu guards sampled, the selection counts of barrier samples:
	// every node adds to them at every check, so they have a lock of
	// their own, apart from mu, which the recorder holds for a while.
	sampledMu sync.Mutex
	sampled   map[peer.ID]int

	mu      sync.Mutex
	rng     *rand.Rand // bootstrap choice, churn victims, partitions, evaluation picks
	members []*member
	nextIdx int               // the next node's number
	stalls  map[int]bool      // members found stalled at some point
	joins   []float64         // seconds from each join's start to its first step
	lags    []float64         // seconds each churn event started after its time
	churned []report.ChurnRow // every leave, crash and join, as it started

	steps  []report.StepRow
	ests   []report.EstRow
	accs   []report.AccRow
	relErr []float64 // |N̂-N|/N of live nodes at the last record
	// usedErr is |N̂-N|/N of the population every honest live node used,
	// at every record; usedMax the largest N̂ among them, usedOff the
	// largest factor one was off N by.
	usedErr []float64
	usedMax float64
	usedOff float64
	// quarter is the process's resources at a quarter of the training
	// time (set by the recorder; read after it stopped).
	quarter *resourceSample
	wg      sync.WaitGroup

	roleOf        sync.Map      // peer.ID -> plan.Role, hostile nodes only
	play          *hostile.Play // the hostile roles
	target        *member       // the honest node flooders attack
	warnLines     atomic.Uint64 // warnings the nodes logged (warnCounter)
	warnBytes     atomic.Uint64
	poisonApplied atomic.Uint64
	normDelivered atomic.Uint64
}

// params returns the number of parameters of the run's model (0 without
// one, or if it cannot be built: building the nodes will say why).
func (t *testnet) params() int {
	if t.data.Train == nil {
		return 0
	}
	m, err := model.New(t.cfg.Model, t.data.Train.Dim, t.data.Train.Classes)
	if err != nil {
		return 0
	}
	return m.NumParams()
}

// Run builds a testnet, trains for cfg.Duration with the configured churn,
// and returns what it measured. The context stops it early (the result
// covers the time run). On the virtual clock Run must be called inside a
// testing/synctest bubble, and ctx must have been made inside it.
func Run(ctx context.Context, cfg plan.Config) (*report.Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("testnet: %w", err)
	}
	if cfg.Transport == "netns" {
		return netns.Run(ctx, cfg)
	}
	// The run's cost is its own, not that of runs before it in this
	// process (a command with several barriers runs one after another):
	// CPU from here, and the peak RSS from the memory still held now.
	debug.FreeOSMemory()
	procstat.ResetPeakRSS()
	t := &testnet{
		cpu0:    procstat.CPUTime(),
		cfg:     cfg,
		log:     cfg.Logger,
		rng:     rand.New(rand.NewPCG(cfg.Seed, 0x7e57)),
		keys:    memnet.KeySource(cfg.Seed, "testnet tcp keys"),
		sampled: make(map[peer.ID]int),
		stalls:  make(map[int]bool),
	}
	if t.log == nil {
		t.log = slog.New(slog.DiscardHandler)
	}
	t.log = slog.New(warnCounter{next: t.log.Handler(), lines: &t.warnLines, bytes: &t.warnBytes})
	if cfg.Model != "none" {
		d, err := model.Open(builtin.DataFor(cfg.Model, cfg.Data))
		if err != nil {
			return nil, fmt.Errorf("testnet: %w", err)
		}
		t.data = d
	}
	est := plan.EstimateRun(cfg, t.params(), runtime.GOMAXPROCS(0))
	if cfg.Estimated != nil {
		cfg.Estimated(est)
	}
	if avail := availableMemory(); !cfg.Force && avail > 0 && est.RSSBytes > avail {
		return nil, fmt.Errorf("testnet: %w", &plan.ErrTooLarge{Estimate: est, Available: avail})
	}
	if cfg.Clock == plan.Virtual && !vclock.InBubble() {
		return nil, errors.New("testnet: the virtual clock needs Run to be called inside a testing/synctest bubble " +
			"(synctest.Test in a test; pspnode testnet makes one itself); set Config.Clock to Real to run on the machine's clock")
	}
	if cfg.Transport == "mem" {
		t.net = memnet.NewNet(memnet.Config{
			LatencyMin: cfg.Latency.Min, LatencyMax: cfg.Latency.Max,
			Bandwidth: cfg.Bandwidth, Seed: cfg.Seed,
		})
	}
	t.play = hostile.New(cfg, t, t.net, t.log)
	defer t.closeAll()

	buildStart := time.Now()
	if err := t.build(ctx); err != nil {
		return nil, err
	}
	t.waitWarm(ctx)
	warm := time.Since(buildStart)

	// Training starts for everyone at once, as in the simulator.
	t.mu.Lock()
	for _, m := range t.members {
		t.baseline(m)
	}
	t.mu.Unlock()
	runCtx, stop := context.WithTimeout(ctx, cfg.Duration)
	defer stop()
	t.start, t.wall0 = time.Now(), t.wallNow()
	cpu0 := procstat.CPUTime()

	// The probe and the recorder start before the nodes, and the nodes
	// only once both wait on their timers. An overloaded Go scheduler runs
	// a goroutine woken by its timer at once, but can leave one that has
	// not run yet behind the nodes' goroutines for as long as they keep
	// it busy: started after the nodes, the recorder of a 200-node run at
	// 1 % of the protocol's pace took its first record after 44 s, and so
	// found no stalled node.
	var bg, ready sync.WaitGroup
	var probe *lagProbe
	if cfg.Clock == plan.Real {
		probe = &lagProbe{}
		ready.Add(1)
		bg.Go(func() { probe.run(runCtx, t.start, ready.Done) })
	}
	ready.Add(1)
	bg.Go(func() { t.recordLoop(runCtx, ready.Done) })
	ready.Wait()
	t.mu.Lock()
	for _, m := range t.members {
		t.kickoff(runCtx, m)
	}
	t.mu.Unlock()
	bg.Go(func() { t.churn(runCtx) })
	if cfg.EvalEvery > 0 && cfg.Model != "none" {
		bg.Go(func() { t.evalLoop(runCtx) })
	}
	<-runCtx.Done()
	// Training ends now: the nodes' contexts are done. On an overloaded
	// machine the background goroutines may take many seconds more to
	// notice, which is not training time.
	elapsed, cpu := time.Since(t.start), procstat.CPUTime()-cpu0
	bg.Wait()
	final := t.record(elapsed) // final snapshot, before nodes stop
	endRes := sampleResources(final.Live)
	if cfg.Model != "none" {
		t.evaluate(elapsed)
	}
	res := t.result(elapsed, warm)
	res.Resources = t.resources(endRes, elapsed)
	if wall := t.wallNow(); wall >= 0 {
		res.WallS = (wall - t.wall0).Seconds()
		if res.WallS > 0 {
			res.VirtualPerWall = elapsed.Seconds() / res.WallS
		}
	}
	if probe != nil {
		res.Overload = t.overload(probe, elapsed, cpu, res)
	}
	res.Membership = t.membership()
	res.FillCost()
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

// build creates the initial nodes: stragglers are exactly round(F·N) of
// them and roles round(share·N) each, chosen by the seed. Sybil-zone nodes
// come last: their keys are ground against victims that must exist.
func (t *testnet) build(ctx context.Context) error {
	cfg := t.cfg
	pick := rand.New(rand.NewPCG(cfg.Seed, 0x57a6))
	straggler := make([]bool, cfg.Nodes)
	for _, i := range pick.Perm(cfg.Nodes)[:int(math.Round(cfg.Stragglers*float64(cfg.Nodes)))] {
		straggler[i] = true
	}
	roles := plan.AssignRoles(cfg.Nodes, cfg.Roles, cfg.Seed)
	order := make([]int, 0, cfg.Nodes)
	for i, r := range roles {
		if r != plan.SybilZone {
			order = append(order, i)
		}
	}
	firstZone := len(order)
	for i, r := range roles {
		if r == plan.SybilZone {
			order = append(order, i)
		}
	}
	buildStart := time.Now()
	var victims []peer.ID
	for built, i := range order {
		if err := ctx.Err(); err != nil {
			return err
		}
		f := 1.0
		if straggler[i] {
			f = cfg.StraggleFactor
		}
		var id hostile.Identity
		if roles[i].Sybil() {
			if built == firstZone {
				victims = t.play.ChooseVictims(t.honestIDs())
			}
			var victim peer.ID
			if len(victims) > 0 {
				victim = victims[(built-firstZone)%len(victims)]
			}
			var err error
			if id, err = t.play.SybilIdentity(roles[i], victim); err != nil {
				return fmt.Errorf("testnet: node %d: %w", i, err)
			}
		}
		m, err := t.addNode(ctx, f, false, roles[i], id, nil)
		if err != nil {
			return fmt.Errorf("testnet: node %d: %w", i, err)
		}
		if t.target == nil && m.role == plan.Honest {
			t.target = m
			t.play.SetTarget(m.nd)
		}
		if cfg.BuildProgress != nil && ((built+1)%50 == 0 || built+1 == cfg.Nodes) {
			cfg.BuildProgress(built+1, cfg.Nodes, time.Since(buildStart))
		}
	}
	return nil
}

// wallNow is the wall time since a fixed moment, or -1 when the run cannot
// tell: on the virtual clock only Config.WallClock knows it.
func (t *testnet) wallNow() time.Duration {
	switch {
	case t.cfg.WallClock != nil:
		return t.cfg.WallClock()
	case t.cfg.Clock == plan.Real:
		return time.Duration(time.Now().UnixNano())
	}
	return -1
}
