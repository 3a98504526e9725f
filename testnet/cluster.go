package testnet

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	manet "github.com/multiformats/go-multiaddr/net"

	"github.com/pspnode/pspnode/gossip"
	"github.com/pspnode/pspnode/internal/builtin"
	"github.com/pspnode/pspnode/internal/faults"
	"github.com/pspnode/pspnode/internal/memnet"
	"github.com/pspnode/pspnode/internal/vclock"
	"github.com/pspnode/pspnode/model"
	"github.com/pspnode/pspnode/node"
	"github.com/pspnode/pspnode/node/status"
	"github.com/pspnode/pspnode/psp"
	"github.com/pspnode/pspnode/testnet/hostile"
	"github.com/pspnode/pspnode/testnet/plan"
	"github.com/pspnode/pspnode/testnet/report"
)

// member is one node of the testnet, live or gone.
type member struct {
	idx      int
	nd       *node.Node
	factor   float64
	role     plan.Role
	cancel   context.CancelFunc
	done     chan struct{}
	joinedAt time.Duration // since training started (0 for initial nodes)
	leftAt   time.Duration // -1 while live
	crashed  bool
	lastStep int64
	// quit: the node stopped training on purpose (a lineage-hijack
	// node's campaign): the recorder leaves it out of the steps and
	// stalls. Under the testnet's mu.
	quit bool
	// opened0 is the node's connections-opened count when it was launched
	// (training start, or its join), so the rate covers training only.
	opened0 uint64
	// traffic0 and step0 are the node's traffic and step at its launch,
	// so that the traffic report covers training only.
	traffic0 status.Traffic
	step0    int64
	// freeSince is when the node last became free to go on at lastStep:
	// its barrier, on the true population, would let it, and it is not
	// computing a step of plausible length (stallStepShare). -1 while it
	// is not free.
	freeSince time.Duration
	// progressAt is when the recorder last saw the node's step change (or
	// the node's launch).
	progressAt time.Duration
	// gone holds what the report needs of an honest node that departed;
	// nd is then nil, so that a long run with churn does not keep every
	// departed node's host, overlay and model in memory.
	gone *goneNode
	// probe marks a joiner started through a joiner-wedge node: honest,
	// but reported apart (Hostility.Wedge), not among the honest nodes.
	probe bool
}

// goneNode is what the report reads of a departed node.
type goneNode struct {
	step    int64
	updates gossip.Stats
}

// step is the member's step (at its departure, if it left).
func (m *member) step() int64 {
	if m.gone != nil {
		return m.gone.step
	}
	return m.nd.Step()
}

// updateStats is the member's update counts (at its departure, if it
// left).
func (m *member) updateStats() gossip.Stats {
	if m.gone != nil {
		return m.gone.updates
	}
	return m.nd.UpdateStats()
}

// release drops a departed honest node once it has stopped, keeping what
// the report reads. Hostile nodes and the flood target are kept: their
// goroutines and figures refer to them to the end. t.mu must be held.
func (t *testnet) release(m *member) {
	if m.role != plan.Honest || m.probe || m == t.target || m.gone != nil {
		return
	}
	m.gone = &goneNode{step: m.nd.Step(), updates: m.nd.UpdateStats()}
	m.nd = nil
}

// launched starts the stall rule's clock for a member launched at now at
// step: it is free to go on from its launch (it has not started a step,
// and its barrier has nothing to wait for yet), and the records that
// follow find out whether it went on. Counting from the launch rather than
// from the first record keeps a node that never steps visible as stalled
// when the recorder itself gets little CPU.
func (m *member) launched(now time.Duration, step int64) {
	m.freeSince, m.progressAt, m.lastStep = now, now, step
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

// nodeConfig is what every node of the testnet is configured with before
// its own parts (bootstrap peers, host or identity, seed, task, faults):
// node.DefaultLocalConfig with the testnet's settings. A joining node
// fetches the model and a step from its peers.
func (t *testnet) nodeConfig(joining bool) (node.Config, error) {
	cfg := node.DefaultLocalConfig()
	cfg.Job = "testnet"
	cfg.Barrier = t.cfg.Barrier
	cfg.EvalEvery = 0 // the recorder evaluates the models, on the run's clock
	cfg.JoinFetch = joining
	cfg.Genesis = plan.Genesis(t.cfg.Seed) // one lineage: the nodes start the job together
	cfg.Overlay.Logger = t.log
	cfg.Gossip.Logger = t.log
	enc, err := gossip.ParseEncoding(t.cfg.Encoding)
	if err != nil {
		return node.Config{}, err
	}
	cfg.Gossip.Encoding = enc
	cfg.Check.PollShare, cfg.Check.Pace = t.cfg.PollShare, t.cfg.Pace
	if t.cfg.Private {
		cfg.PSK = plan.PSK(t.cfg.Seed)
	}
	cfg.Exchange.Spec = t.cfg.Exchange
	if t.cfg.NoScreen {
		cfg.Screen = psp.ScreenConfig{}
	}
	cfg.Exchange.StaleSteps = t.cfg.StaleSteps
	switch {
	case t.cfg.NormBound > 0:
		cfg.Exchange.NormBound = t.cfg.NormBound
	case t.cfg.NormBound < 0:
		cfg.Exchange.NormBound = 0
	}
	cfg.Limits.ConnLow, cfg.Limits.ConnHigh, cfg.Overlay.PoolSize = t.cfg.Limits()
	cfg.Limits.StepStreams = stepStreams(cfg)
	if t.cfg.StepStreams > 0 {
		cfg.Limits.StepStreams = t.cfg.StepStreams
	}
	// Background overlay work grows with N: past overlay.SharedMachineNodes
	// the overlay's periods stretch in proportion, so the testnet's total
	// background load stays that of that many nodes.
	cfg.Overlay = cfg.Overlay.ForSharedMachine(t.cfg.Nodes)
	if t.cfg.NoSybilDefence {
		cfg.Overlay.PerAddress = 0
	}
	return cfg, nil
}

// stepStreams is how many idle step streams a testnet node keeps: one per
// connection it may hold, up to half its inbound stream cap (above that an
// answerer closes each stream after one exchange), and never fewer than
// the node's default. A node samples its step queries from every peer; at
// 200 nodes of pBSP(10) the default 64 made 57 % of queries open a new
// stream, and 256 cut the run's CPU by 1.4× (with 13 % less RSS: fewer
// streams made and collected). Above 500 nodes fewer would save memory
// and cost CPU: 16 in place of 64 at 1000 nodes took 5–11 % less RSS and
// 5–7 % more CPU (Config.StepStreams sets it).
func stepStreams(cfg node.Config) int {
	return max(cfg.Limits.StepStreams, min(cfg.Limits.ConnHigh, cfg.Limits.MaxInboundStreams/2))
}

// addNode creates a node (not yet training) bootstrapped from up to three
// random live members (via alone, if set: a probe of joiner-wedge nodes,
// reported apart), with identity id on the mem transport.
func (t *testnet) addNode(ctx context.Context, factor float64, joining bool, role plan.Role, id hostile.Identity, via []*node.Node) (*member, error) {
	cfg, err := t.nodeConfig(joining)
	if err != nil {
		return nil, err
	}
	idx, key, err := t.reserve(&cfg, joining, via)
	if err != nil {
		return nil, err
	}
	h, err := t.newHost(idx, cfg, joining, role, id) // nil off the mem transport: the node builds one
	if err != nil {
		return nil, err
	}
	if h == nil {
		cfg.Identity = key // on loopback, as DefaultLocalConfig listens
	}
	cfg.Seed = t.cfg.Seed*1_000_003 + uint64(idx) + 1
	task, err := t.newTask(idx, factor, cfg)
	if err != nil {
		if h != nil {
			_ = h.Close() // ours until node.New has it
		}
		return nil, err
	}
	var self peer.ID
	f := t.play.Faults(role, cfg.Seed, &self, task.NumParams(), task.ModelID())
	honest := role == plan.Honest
	f.OnSample = func(peers []peer.ID) { t.countSample(self, honest, peers) }
	faults.SetNode(&cfg, f)
	opts := []node.Option{node.WithTask(task), node.WithLogger(t.log)}
	if h != nil {
		opts = append(opts, node.WithHost(h))
	}
	var nd *node.Node
	asNode(idx, func() { nd, err = node.New(ctx, cfg, opts...) })
	if err != nil {
		return nil, err
	}
	self = nd.ID()
	m := &member{idx: idx, nd: nd, factor: factor, role: role, leftAt: -1, freeSince: -1, done: make(chan struct{}), probe: len(via) > 0}
	if joining {
		m.joinedAt = time.Since(t.start)
	}
	t.register(m, cfg.Seed)
	return m, nil
}

// reserve gives a new node its number (its seed and shard), logs a join,
// adds up to three live nodes to cfg's bootstrap list (via alone, if set),
// and draws a host key when the node builds its own host (tcp).
func (t *testnet) reserve(cfg *node.Config, joining bool, via []*node.Node) (idx int, key crypto.PrivKey, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	idx = t.nextIdx
	t.nextIdx++
	if joining {
		t.churned = append(t.churned, report.ChurnRow{T: time.Since(t.start).Seconds(), Kind: string(plan.Join), Node: idx})
	}
	if len(via) > 0 {
		for _, nd := range via {
			for _, a := range nd.Addrs() {
				cfg.Bootstrap = append(cfg.Bootstrap, a.String())
				break
			}
		}
	} else {
		live := t.liveLocked()
		for _, j := range t.rng.Perm(len(live))[:min(3, len(live))] {
			for _, a := range live[j].nd.Addrs() {
				cfg.Bootstrap = append(cfg.Bootstrap, a.String())
				break
			}
		}
	}
	if t.net == nil {
		key, _, err = crypto.GenerateEd25519Key(t.keys)
	}
	return idx, key, err
}

// newHost builds node idx's host on the mem transport, and notes the
// addresses of the initial nodes for the Sybil figures; nil on others.
func (t *testnet) newHost(idx int, cfg node.Config, joining bool, role plan.Role, id hostile.Identity) (host.Host, error) {
	if t.net == nil {
		return nil, nil
	}
	var h host.Host
	var err error
	asNode(idx, func() {
		h, err = t.net.NewHostWith(memnet.HostOptions{Low: cfg.Limits.ConnLow, High: cfg.Limits.ConnHigh, Grace: t.cfg.ConnGrace, Key: id.Key, IP: id.IP})
	})
	if err != nil {
		return nil, err
	}
	if !joining {
		var ips []string
		for _, a := range h.Addrs() {
			if ip, err := manet.ToIP(a); err == nil {
				ips = append(ips, ip.String())
			}
		}
		t.play.NoteAddrs(ips, role.Sybil())
	}
	return h, nil
}

// newTask builds node idx's task: the run's model on its shard of the
// data, or sleeps of the time model without one.
func (t *testnet) newTask(idx int, factor float64, cfg node.Config) (node.Task, error) {
	spec := builtin.Spec{
		Model: t.cfg.Model, Shard: idx % t.cfg.Nodes, Shards: t.cfg.Nodes,
		SGD:  model.DefaultSGDConfig(),
		Time: builtin.TimeModel{Scale: t.cfg.TimeScale, Factor: factor},
		Seed: cfg.Seed, InitSeed: builtin.SeedOf(cfg.Job),
	}
	if t.cfg.LR > 0 {
		spec.SGD.LR0 = t.cfg.LR
	}
	return builtin.New(spec, t.data)
}

// register makes m a member of the run: its role is noted (an honest node
// of a run with hostile roles counts the poison it receives), and the
// hostile roles ready it (hostile.Play.Install).
func (t *testnet) register(m *member, seed uint64) {
	if m.role != plan.Honest {
		t.roleOf.Store(m.nd.ID(), m.role)
	} else if g := m.nd.Gossip(); g != nil && len(t.cfg.Roles) > 0 {
		// Count what honest nodes receive from poisoners.
		g.Subscribe(func(u gossip.Update) {
			r, ok := t.roleOf.Load(u.Sender)
			switch {
			case !ok:
			case r.(plan.Role).InvalidPoison():
				t.poisonApplied.Add(1)
			case r.(plan.Role) == plan.PoisonNorm:
				t.normDelivered.Add(1)
			}
		})
	}
	t.mu.Lock()
	t.members = append(t.members, m)
	t.play.Install(m.nd, m.role, seed)
	t.mu.Unlock()
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

// countSample counts a barrier sample drawn by the node drawer.
func (t *testnet) countSample(drawer peer.ID, honest bool, peers []peer.ID) {
	t.sampledMu.Lock()
	for _, p := range peers {
		t.sampled[p]++
	}
	t.sampledMu.Unlock()
	if honest {
		t.play.CountDraws(drawer, peers)
	}
}

// launch starts a member's training loop. t.mu must be held.
func (t *testnet) launch(ctx context.Context, m *member) {
	t.baseline(m)
	t.kickoff(ctx, m)
}

// baseline takes the counts a member's training figures start from. It
// asks the node for its status, which on an overloaded machine can take a
// while: Run takes every initial node's baseline before the training
// starts, not as it starts each one. t.mu must be held.
func (t *testnet) baseline(m *member) {
	m.opened0 = m.nd.Status().ConnectionsOpened
	m.traffic0, m.step0 = m.nd.Traffic(), m.nd.Step()
}

// kickoff starts a member's training loop, its baseline taken. t.mu must be
// held.
func (t *testnet) kickoff(ctx context.Context, m *member) {
	c, cancel := context.WithCancel(ctx)
	m.cancel = cancel
	m.launched(time.Since(t.start), m.nd.Step())
	run, stopRun := context.WithCancel(c)
	t.wg.Go(func() {
		defer close(m.done)
		defer stopRun()
		asNode(m.idx, func() {
			if err := m.nd.Run(run); err != nil {
				t.log.Warn("node failed", "node", m.idx, "err", err)
			}
		})
	})
	// A lineage-hijack node's campaign quits training for good.
	quit := func() {
		stopRun()
		t.mu.Lock()
		m.quit = true
		t.mu.Unlock()
	}
	for _, campaign := range t.play.Campaigns(m.role, m.nd, quit) {
		t.wg.Go(func() { asNode(m.idx, func() { campaign(c) }) })
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
		vclock.Sleep(ctx, 100*time.Millisecond)
	}
}

func (t *testnet) closeAll() {
	t.mu.Lock()
	ms := slices.Clone(t.members)
	t.mu.Unlock()
	var wg sync.WaitGroup
	for _, m := range ms {
		if m.nd != nil { // released departed nodes are closed already
			wg.Go(func() { _ = m.nd.Close() })
		}
	}
	wg.Wait()
	if t.net != nil {
		_ = t.net.Close()
	}
	if t.cfg.Clock == plan.Virtual {
		// Some library goroutines outlive their host by a bounded sleep
		// (go-libp2p-pubsub's announceRetry sleeps up to 1 s, then sees
		// its context is done). On the virtual clock that time costs
		// nothing, and waiting it out lets Run return with every
		// goroutine it started gone, as a synctest bubble requires.
		time.Sleep(librarySettle)
	}
}

// librarySettle outlasts the longest bounded sleep of a library goroutine
// after its host closed.
const librarySettle = 2 * time.Second

// remove stops n random live nodes, all at once, and returns when they
// have stopped, with how many it stopped (none while two or fewer run).
func (t *testnet) remove(n int, crash bool) int {
	t.mu.Lock()
	var live []*member
	for _, m := range t.liveLocked() {
		// A joiner is listed before it is launched (join); only a node
		// that runs can leave or crash.
		if m.cancel != nil {
			live = append(live, m)
		}
	}
	if len(live) <= 2 {
		t.mu.Unlock()
		return 0
	}
	n = min(n, len(live)-2) // keep a network
	now := time.Since(t.start)
	var victims []*member
	kind := plan.Leave
	if crash {
		kind = plan.Crash
	}
	for _, j := range t.rng.Perm(len(live))[:n] {
		m := live[j]
		m.leftAt, m.crashed = now, crash
		victims = append(victims, m)
		t.churned = append(t.churned, report.ChurnRow{T: now.Seconds(), Kind: string(kind), Node: m.idx})
	}
	t.mu.Unlock()
	t.stop(victims, crash)
	return len(victims)
}

// stop stops the victims (marked as left), all at once, and returns when
// they have stopped.
func (t *testnet) stop(victims []*member, crash bool) {
	var wg sync.WaitGroup
	for _, m := range victims {
		wg.Go(func() {
			m.cancel()
			if crash {
				_ = m.nd.Close()
				<-m.done
			} else {
				<-m.done // finish or abandon the step, then say goodbye
				_ = m.nd.Leave(300 * time.Millisecond)
			}
			t.mu.Lock()
			t.release(m)
			t.mu.Unlock()
		})
	}
	wg.Wait()
}

// removeHostile stops every running node of a hostile or faulty role at
// once, without a word, and returns when they have stopped.
func (t *testnet) removeHostile() {
	t.mu.Lock()
	var victims []*member
	now := time.Since(t.start)
	for _, m := range t.liveLocked() {
		if m.role != plan.Honest && m.cancel != nil {
			m.leftAt, m.crashed = now, true
			victims = append(victims, m)
			t.churned = append(t.churned, report.ChurnRow{T: now.Seconds(), Kind: string(plan.Crash), Node: m.idx})
		}
	}
	t.mu.Unlock()
	t.stop(victims, true)
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

// join adds a node that joins the running job, and times it from its
// start to its first step (joinWatch).
func (t *testnet) join(ctx context.Context) {
	begun := time.Now()
	m, err := t.addNode(ctx, 1, true, plan.Honest, hostile.Identity{}, nil)
	if err != nil {
		if ctx.Err() == nil {
			t.log.Warn("join failed", "err", err)
		}
		return
	}
	t.mu.Lock()
	t.launch(ctx, m)
	t.mu.Unlock()
	t.wg.Go(func() { t.joinWatch(ctx, m, begun) })
}

// joinWatchPeriod is how often a joiner is looked at until its first step.
const joinWatchPeriod = 10 * time.Millisecond

// joinWatch records how long m took from the start of its join to its
// first step: the first barrier check, which follows the first step.
func (t *testnet) joinWatch(ctx context.Context, m *member, begun time.Time) {
	tick := time.NewTicker(joinWatchPeriod)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.done:
			return
		case <-tick.C:
		}
		t.mu.Lock()
		nd := m.nd // nil once the node departed and was released
		t.mu.Unlock()
		if nd == nil {
			return
		}
		if nd.Status().BarrierChecks > 0 {
			t.mu.Lock()
			t.joins = append(t.joins, time.Since(begun).Seconds())
			t.mu.Unlock()
			return
		}
	}
}

// The testnet is the hostile roles' network (hostile.Net).
var _ hostile.Net = (*testnet)(nil)

// RoleOf returns the role of node p; false for an honest node.
func (t *testnet) RoleOf(p peer.ID) (plan.Role, bool) {
	r, ok := t.roleOf.Load(p)
	if !ok {
		return plan.Honest, false
	}
	return r.(plan.Role), true
}

// Live returns the live nodes of role r, in the order they were made.
func (t *testnet) Live(r plan.Role) []*node.Node {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []*node.Node
	for _, m := range t.members {
		if m.role == r && m.nd != nil && m.leftAt < 0 {
			out = append(out, m.nd)
		}
	}
	return out
}

// JoinVia starts a fresh honest joiner that bootstraps through via alone:
// a probe of joiner-wedge nodes, reported apart (Hostility.Wedge).
func (t *testnet) JoinVia(ctx context.Context, via []*node.Node) error {
	j, err := t.addNode(ctx, 1, true, plan.Honest, hostile.Identity{}, via)
	if err != nil {
		return err
	}
	t.mu.Lock()
	t.launch(ctx, j)
	t.mu.Unlock()
	return nil
}

// honestIDs returns the honest members' peer IDs, in the order they were
// made.
func (t *testnet) honestIDs() []peer.ID {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []peer.ID
	for _, m := range t.members {
		if m.role == plan.Honest {
			out = append(out, m.nd.ID())
		}
	}
	return out
}
