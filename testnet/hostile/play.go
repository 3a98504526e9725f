package hostile

import (
	"context"
	"log/slog"
	"slices"
	"sync"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/internal/memnet"
	"github.com/pspnode/pspnode/node"
	"github.com/pspnode/pspnode/testnet/plan"
	"github.com/pspnode/pspnode/testnet/report"
)

// Net is what the roles need of the testnet that runs them: the in-process
// testnet implements it.
type Net interface {
	// RoleOf returns the role of node p, and false for an honest node (or
	// one not of the run).
	RoleOf(p peer.ID) (plan.Role, bool)
	// Live returns the live nodes of role r, in the order they were made.
	Live(r plan.Role) []*node.Node
	// JoinVia starts a fresh honest joiner that bootstraps through via
	// alone. The testnet reports it apart from the honest nodes
	// (report.Hostility.Wedge).
	JoinVia(ctx context.Context, via []*node.Node) error
}

// Play is the hostile side of one run: what the roles share (the target,
// the Sybils' victims, the fake DHT servers) and what they counted.
type Play struct {
	cfg    plan.Config
	net    Net
	mem    *memnet.Net // nil off the mem transport
	log    *slog.Logger
	target *node.Node // the honest node flooders and hogs attack; see SetTarget

	counts    hostileCounts
	hogs      hogCounts
	freshOnce sync.Once // starts the fresh peers against the target
	syb       *sybilState
	fakesMu   sync.Mutex
	fakes     []*fakeDHT
}

// New returns the hostile side of a run of cfg on net; mem is its memnet
// network (nil on the tcp transport), log where the roles warn.
func New(cfg plan.Config, net Net, mem *memnet.Net, log *slog.Logger) *Play {
	p := &Play{cfg: cfg, net: net, mem: mem, log: log}
	if slices.ContainsFunc(cfg.Roles, func(r plan.RoleShare) bool { return r.Role.Sybil() }) {
		p.syb = newSybilState(cfg.Seed)
	}
	return p
}

// SetTarget names the honest node the flooders, slow-model nodes and hogs
// attack. Call it before the first Campaigns; without it they do nothing.
func (p *Play) SetTarget(nd *node.Node) { p.target = nd }

// Install readies a node of role r as it joins the run, before it trains:
// a fake-peers node's DHT server, a joiner-wedge node's impostor.
func (p *Play) Install(nd *node.Node, r plan.Role, seed uint64) {
	switch r {
	case plan.FakePeers:
		p.serveFakePeers(nd, seed)
	case plan.JoinerWedge:
		p.startImpostor(nd)
	}
}

// Campaigns returns what a node of role r does beside training, each to
// run in a goroutine of its own until ctx ends. quit stops the node's
// training for good (a lineage-hijack node's campaign calls it).
func (p *Play) Campaigns(r plan.Role, nd *node.Node, quit func()) []func(ctx context.Context) {
	var out []func(ctx context.Context)
	add := func(f func(ctx context.Context)) { out = append(out, f) }
	if t := p.target; t != nil {
		switch r {
		case plan.Flooder:
			add(func(ctx context.Context) { p.flood(ctx, nd, t.ID()) })
		case plan.SlowModel:
			add(func(ctx context.Context) { p.slowModel(ctx, nd, t.ID()) })
		}
	}
	switch r {
	case plan.LineageHijack:
		add(func(ctx context.Context) { p.hijack(ctx, nd, quit) })
	case plan.JoinerWedge:
		add(func(ctx context.Context) { p.wedgeJoin(ctx, nd) })
	case plan.DriftPoison:
		add(func(ctx context.Context) { p.drift(ctx, nd) })
	case plan.EstimateLiar:
		add(func(ctx context.Context) { p.lie(ctx, nd) })
	case plan.StreamHog, plan.ConnHog, plan.LogFlood:
		if p.target == nil {
			break
		}
		switch r {
		case plan.StreamHog:
			add(func(ctx context.Context) { p.streamHog(ctx, nd) })
		case plan.ConnHog:
			add(func(ctx context.Context) { p.connHog(ctx, nd) })
		default:
			add(func(ctx context.Context) { p.logFlood(ctx, nd) })
		}
		p.freshOnce.Do(func() { add(func(ctx context.Context) { p.freshPeers(ctx, nd) }) })
	}
	return out
}

// Probe is a joiner started through joiner-wedge nodes, at the end.
type Probe struct {
	Node *node.Node
	Live bool
}

// Figures fills h with what the roles did: the impostors', hogs', Sybils'
// and fake-peers nodes' figures. honest are the honest live nodes (probes
// left out), probes the joiners through joiner-wedge nodes. Call it with
// the nodes still running.
func (p *Play) Figures(h *report.Hostility, honest []*node.Node, probes []Probe) {
	p.impostorFigures(h, honest, probes)
	h.Hogs = p.hogFigures()
	h.SybilFigures = p.sybilFigures()
	h.FakePeersNamed = p.fakesNamed()
}
