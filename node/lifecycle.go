package node

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-libp2p/p2p/net/connmgr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pspnode/pspnode/internal/lineage"
	"github.com/pspnode/pspnode/internal/wire"
	"github.com/pspnode/pspnode/node/barrier"
	"github.com/pspnode/pspnode/node/netsetup"
	"github.com/pspnode/pspnode/node/status"
	"github.com/pspnode/pspnode/overlay"
	"github.com/pspnode/pspnode/psp"
)

// New builds a node from its settings (cfg) and what it runs with (opts):
// the host (unless WithHost gives one), the overlay (which joins through
// cfg.Bootstrap), the gossip topic for the task's updates, and the
// protocol handlers. Training starts with Run. Leave (graceful) or Close
// (abrupt) releases it all.
//
// A host given with WithHost belongs to the node from the moment New is
// called, whether New succeeds or not: if New fails, for any reason
// (Validate's included), it has closed the host before it returns; if it
// succeeds, Close (or Leave) closes it. The caller must not close it
// itself, nor use it for anything else once the node has it.
func New(ctx context.Context, cfg Config, opts ...Option) (*Node, error) {
	var d deps
	for _, o := range opts {
		o(&d)
	}
	if err := errors.Join(append([]error{cfg.Validate()}, d.validate(cfg)...)...); err != nil {
		if d.host != nil {
			_ = d.host.Close()
		}
		return nil, fmt.Errorf("node: %w", err)
	}
	n := &Node{
		cfg:       cfg,
		log:       d.log,
		reg:       d.reg,
		givenHost: d.host != nil,
		started:   time.Now(),
		decider:   psp.NewDecider(cfg.Barrier),
	}
	n.boot.started = n.started
	n.life, n.endLife = context.WithCancel(context.Background())
	n.active, n.endActive = context.WithCancel(n.life)
	if n.log == nil {
		n.log = slog.New(slog.DiscardHandler)
	}
	if n.reg == nil {
		n.reg = prometheus.NewRegistry()
	}
	n.m = status.NewMetrics(n.reg)
	n.pop = &census{started: n.started, window: cfg.Overlay.EstimateWindow, reportAge: cfg.Overlay.ReportMaxAge, m: n.m}
	n.iso = &isolation{hold: 2 * cfg.Overlay.DeadHold, job: cfg.Job, m: n.m, log: n.log, emit: n.emit, left: n.pop.Repopulate}
	n.pop.lastLeave = n.iso.lastLeave
	n.kin = &kinship{
		lin: lineage.New(n.reg, cfg.Genesis), staleness: cfg.Barrier.BaseStaleness(), log: n.log,
		fixed: func() bool { return n.driver == nil || n.modelUp.Load() },
	}
	n.meter = status.NewMeter(cfg.Job)
	n.reg.MustRegister(n.meter.Collector(func() uint64 { return topicPayloadBytes(n.Gossip()) }))
	n.nat = netsetup.NewNAT(n.reg)

	inbound := 0 // the inbound limit of a host the node builds (connGuard)
	if d.host != nil {
		n.nat.Attach(d.host)
		n.h = wire.ThrottleAnswers(n.meter.WrapHost(d.host), wire.DHTProtocol(cfg.Job), wire.DHTAnswerRate, n.m.DHTThrottled)
	} else {
		rm, cl, err := netsetup.ResourceManager([]protocol.ID{wire.StepProtocol(cfg.Job), wire.StepProtocolExt(cfg.Job), wire.ModelProtocol(cfg.Job), wire.ExchangeProtocol(cfg.Job)},
			cfg.Limits.MaxStreamsPerPeer, cfg.Limits.ConnLow, cfg.Limits.ConnHigh)
		if err != nil {
			return nil, fmt.Errorf("node: resource manager: %w", err)
		}
		cm, err := connmgr.NewConnManager(cl.Low, cl.High, connmgr.WithGracePeriod(time.Minute))
		if err != nil {
			_ = rm.Close()
			return nil, fmt.Errorf("node: connection manager: %w", err)
		}
		inbound = cl.Inbound
		opts := []libp2p.Option{
			libp2p.ListenAddrStrings(cfg.Listen...),
			libp2p.ConnectionManager(cm),
			libp2p.ResourceManager(rm),
			libp2p.PrometheusRegisterer(n.reg),
			libp2p.UserAgent(userAgent(cfg)),
			libp2p.ProtocolVersion(IdentifyProtocol),
		}
		if cfg.Identity != nil {
			opts = append(opts, libp2p.Identity(cfg.Identity))
		}
		opts = append(opts, netsetup.GateOptions(cfg.PSK, cfg.AllowPeers, cfg.hostFaults.RefuseDirectInbound, n.log, n.reg)...)
		opts = append(opts, natOptions(cfg, n.nat, n.reg)...)
		h, err := libp2p.New(opts...)
		if err != nil {
			// Both run goroutines from their constructors; libp2p closes
			// them on some failures but not all (not when an option is
			// refused). Close is idempotent on both.
			_ = rm.Close()
			_ = cm.Close()
			return nil, fmt.Errorf("node: libp2p host: %w", err)
		}
		n.nat.Attach(h)
		n.h = wire.ThrottleAnswers(n.meter.WrapHost(h), wire.DHTProtocol(cfg.Job), wire.DHTAnswerRate, n.m.DHTThrottled)
	}
	n.boot.mark(msListening)
	seed := cfg.Seed
	if seed == 0 {
		sum := sha256.Sum256([]byte(n.h.ID()))
		seed = binary.BigEndian.Uint64(sum[:8])
	}
	n.rng = rand.New(rand.NewPCG(seed, 0x90de))
	n.events = d.events
	n.work, n.model = d.task, d.model
	switch {
	case d.task != nil:
		n.model = d.task
	case d.model == nil:
		n.work, n.model = noWork{}, noWork{}
	}

	n.kin.model = n.model
	if cfg.Driven {
		n.driver = &Driver{n: n}
		n.idle.Store(true) // out of peers' barriers until a trainer comes
	}

	n.ready = make(chan struct{})
	fail := func(err error) (*Node, error) {
		close(n.ready) // n.up stays false: waiting handlers reset their streams
		n.closeParts()
		return nil, err
	}
	n.guard = &connGuard{h: n.h, limits: cfg.Limits, m: n.m, life: n.life, inbound: inbound, kick: make(chan struct{}, 1)}
	n.conns = &network.NotifyBundle{
		ConnectedF: func(_ network.Network, c network.Conn) {
			n.opened.Add(1)
			n.m.ConnsOpened.Inc()
			if c.Stat().Direction == network.DirInbound {
				n.guard.inboundOpened()
			}
		},
		DisconnectedF: func(_ network.Network, c network.Conn) { n.nat.Closed(c) },
	}
	n.h.Network().Notify(n.conns)
	n.newStepParts()
	n.bar = barrier.New(barrier.Parts{
		Node:    (*barrierHooks)(n),
		Config:  barrier.Config{Check: checkConfig(cfg), Screen: cfg.Screen, Faults: &n.cfg.faults},
		Metrics: n.m, Census: n.pop, Isolation: n.iso, Startup: &n.boot, Kin: n.kin, Asker: n.asker,
		Step: &n.step, Compute: &n.compute, Interval: &n.interval, Started: n.started,
		Life: n.life, Active: n.active,
		Shuffle: func(k int, swap func(i, j int)) {
			n.rngMu.Lock()
			defer n.rngMu.Unlock()
			n.rng.Shuffle(k, swap)
		},
		Decider: n.decider,
	})
	n.resets.m, n.resets.log, n.resets.life = n.m, n.log, n.life
	n.kin.forget = func(p peer.ID) {
		n.bar.Progress().Forget(p)
		n.asker.Drop(p)
	}
	n.h.SetStreamHandler(wire.StepProtocol(cfg.Job), n.serveStep)
	n.h.SetStreamHandler(n.stepExtID, n.serveStep)
	n.mp = &modelProto{
		h: n.h, job: cfg.Job, timeout: cfg.Check.QueryTimeout, maxAbs: cfg.Exchange.MaxAbsValue, model: n.model,
		life: n.life, m: n.m, log: n.log, src: &modelSource{n: n}, budget: wire.NewModelBudget(),
		in: wire.NewInbound(wire.ModelStreamsPerPeer, wire.ModelStreamsTotal),
	}
	n.h.SetStreamHandler(wire.ModelProtocol(cfg.Job), n.limitedBy(n.mp.in, "model", n.mp.serve))

	if err := n.newOverlay(ctx); err != nil {
		return fail(fmt.Errorf("node: %w", err))
	}
	n.stepIn.SetKnown(n.ov.Knows) // idle step streams of unknown peers make room (wire.Inbound)
	registerGauges(n.reg, n.h, n.ov, n.pop)
	if n.model.NumParams() > 0 {
		if err := n.attachModel(ctx); err != nil {
			return fail(fmt.Errorf("node: %w", err))
		}
	}
	n.guard.start()
	n.up.Store(true)
	close(n.ready)
	n.boot.mark(msNew)
	return n, nil
}

// attachModel sets up what a node with a model needs: the exchange
// protocol (every node with a model serves it: under gossip, to refuse
// epidemic peers' models with a clear reason), and the epidemic state or
// the gossip topic. New calls it when the task has parameters; a driven
// node whose trainer says what its model is calls it through
// Driver.Attach. modelUp is set once ex and xm are: code outside the
// goroutine that attaches checks it before touching them.
func (n *Node) attachModel(ctx context.Context) error {
	n.modelMu.Lock()
	defer n.modelMu.Unlock()
	if n.modelUp.Load() {
		return nil
	}
	if n.closing {
		return ErrClosed
	}
	ex, err := n.newExchange(ctx)
	if err != nil {
		return err
	}
	n.ex = ex
	n.modelUp.Store(true) // before the handler: every request it serves finds ex
	n.h.SetStreamHandler(wire.ExchangeProtocol(n.cfg.Job), n.limitedBy(n.exIn, "exchange", ex.Serve))
	return nil
}

// overlayConfig is the overlay's configuration for a node: cfg.Overlay with
// the job, the bootstrap peers and the logger filled in, KeepJoining on (a
// node whose bootstrap peers do not answer at first starts alone and keeps
// joining), the join's hint on swarm keys, and, when the node is seeded (cfg.Seed != 0) and
// cfg.Overlay.Seed is not set, a seed derived from the node's, so that a
// seeded node samples reproducibly. The overlay
// gets a stream of its own (overlaySeed), not the node's seed itself. An
// unseeded node leaves the overlay on crypto/rand: a seed derived from the
// peer ID, which anyone can read, would let others predict its samples.
func overlayConfig(cfg Config, log *slog.Logger) overlay.Config {
	ocfg := cfg.Overlay
	ocfg.Job = cfg.Job
	ocfg.KeepJoining = true
	ocfg.BootstrapAddrs = append(append([]string(nil), ocfg.BootstrapAddrs...), cfg.Bootstrap...)
	ocfg.PSK = cfg.PSK
	if cfg.MDNS && ocfg.MDNS == "" {
		ocfg.MDNS = overlay.MDNSService(cfg.Job, cfg.PSK)
	}
	if ocfg.Logger == nil {
		ocfg.Logger = log
	}
	if ocfg.Seed == 0 && cfg.Seed != 0 {
		ocfg.Seed = overlaySeed(cfg.Seed)
	}
	if ocfg.JoinHint == nil {
		private := len(cfg.PSK) > 0
		ocfg.JoinHint = func(err string) string { return netsetup.HandshakeHint(err, private) }
	}
	return ocfg
}

// newOverlay builds the overlay, joining through the bootstrap peers. If
// none answers, the overlay starts alone but keeps them (KeepJoining), and
// keeps trying; the one overlay joins through the first that answers.
func (n *Node) newOverlay(ctx context.Context) error {
	ocfg := overlayConfig(n.cfg, n.log)
	ocfg.Registerer = n.reg
	ov, err := overlay.New(ctx, n.h, ocfg)
	if err != nil {
		return err
	}
	if err := ov.JoinError(); err != nil {
		n.log.Warn("no bootstrap peer answered: starting alone and retrying in the background", "err", err)
	}
	n.ov = ov
	n.pop.ov = ov
	n.bar.SetOverlay(ov)
	n.kin.ov = ov
	return nil
}

// overlaySeed derives the overlay's seed from a node seed: SHA-256 of a
// label and the seed, so it is unrelated to the node's own streams (which
// use the seed directly), and never 0 (which the overlay reads as unset).
func overlaySeed(seed uint64) uint64 {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], seed)
	sum := sha256.Sum256(append([]byte("pspnode overlay seed\x00"), b[:]...))
	return max(binary.BigEndian.Uint64(sum[:8]), 1)
}

// awaitReady holds an inbound stream that arrived while New was still
// joining until the node is assembled. It resets the stream, counted as
// refused, if New failed or takes longer than the query timeout.
func (n *Node) awaitReady(s network.Stream, proto string) bool {
	select {
	case <-n.ready:
	default:
		t := time.NewTimer(n.cfg.Check.QueryTimeout)
		defer t.Stop()
		select {
		case <-n.ready:
		case <-t.C:
		}
	}
	if !n.up.Load() {
		n.m.Refused.WithLabelValues(proto).Inc()
		_ = s.Reset()
		return false
	}
	return true
}

// checkConfig is the barrier policy of cfg for psp.Checker.
func checkConfig(cfg Config) psp.CheckConfig {
	return psp.CheckConfig{
		Spec:          cfg.Barrier,
		Replacements:  cfg.Check.Replacements,
		GlobalQueries: cfg.Check.GlobalQueries,
		Timing: psp.TimingConfig{
			PollShare: cfg.Check.PollShare, GlobalPollShare: cfg.Check.GlobalPollShare,
			PollMin: cfg.Check.PollMin.Seconds(), PollMax: cfg.Check.PollMax.Seconds(),
			QueryTimeoutMin: cfg.Check.QueryTimeoutMin.Seconds(), QueryTimeout: cfg.Check.QueryTimeout.Seconds(),
		},
		Pace: cfg.Check.Pace,
	}
}

// limitedBy wraps a stream handler in the caps of l (a stream over its
// peer's cap or the node's is reset at once and counted) and waits, as
// every handler must, until the node is assembled. proto labels the streams it refuses
// (psp_streams_refused_total).
func (n *Node) limitedBy(l *wire.Inbound, proto string, handle network.StreamHandler) network.StreamHandler {
	return func(s network.Stream) {
		from := s.Conn().RemotePeer()
		if !l.Acquire(from) {
			n.m.Refused.WithLabelValues(proto).Inc()
			_ = s.Reset()
			return
		}
		defer l.Release(from)
		if !n.awaitReady(s, proto) {
			return
		}
		handle(s)
	}
}

// Leave stops the node gracefully, as memberlist's Leave and Shutdown do
// together: from now on the node answers every step query as leaving
// (its peers drop it from their samples and population), Run returns
// ErrClosed (abandoning the step in progress) and the Driver's Barrier
// refuses; the peers file (Config.Overlay.PeersFile) gets the peers the
// node knows; up to 32 connected peers are told at once, in parallel,
// within timeout, while every protocol still runs (peers that ask
// meanwhile are told too); then the node closes as Close does. Later
// calls return the first's result; Leave after Close returns ErrClosed.
func (n *Node) Leave(timeout time.Duration) error {
	if err := n.leave(timeout); err != nil {
		return err
	}
	return n.Close()
}

// leave is Leave's first half: the node says it leaves, and keeps running.
func (n *Node) leave(timeout time.Duration) error {
	if n.life.Err() != nil {
		return ErrClosed
	}
	n.leaveOnce.Do(func() {
		n.leaving.Store(true)
		n.endActive()
		if n.ov != nil {
			n.ov.SavePeers() // while the node still knows them
		}
		n.announceLeave(timeout)
	})
	return nil
}

// Close stops the node at once, without a word to its peers, as a crash
// would: Run returns ErrClosed, and gossip, the overlay, the protocol
// handlers and the host (the node's own or the one given with WithHost)
// are closed. Peers find it gone when their queries fail (Leave tells
// them first). It is safe to call more than once; later calls return the
// first's result.
func (n *Node) Close() error {
	n.closeOnce.Do(func() { n.closeErr = n.closeParts() })
	return n.closeErr
}

// announceLeave sends a leaving note to up to 32 known peers, in parallel,
// for at most timeout: cheap, and it lets them drop this node from their
// samples at once instead of timing out on it.
func (n *Node) announceLeave(timeout time.Duration) {
	if n.ov == nil || timeout <= 0 {
		return
	}
	peers := n.ov.Peers()
	n.rngMu.Lock()
	n.rng.Shuffle(len(peers), func(i, j int) { peers[i], peers[j] = peers[j], peers[i] })
	n.rngMu.Unlock()
	if len(peers) > 32 {
		peers = peers[:32]
	}
	ctx, cancel := context.WithTimeout(n.life, timeout)
	defer cancel()
	var wg sync.WaitGroup
	for _, p := range peers {
		if n.h.Network().Connectedness(p) != network.Connected {
			continue
		}
		wg.Go(func() { _, _ = n.queryStep(ctx, p, wire.StepRequest{Leaving: true, Step: n.step.Load()}) })
	}
	wg.Wait()
}

func (n *Node) closeParts() error {
	n.modelMu.Lock()
	n.closing = true // no attachModel from here on, so ex stays as it is
	n.modelMu.Unlock()
	if n.endLife != nil {
		n.endLife()
	}
	var errs []error
	errs = append(errs, n.exch().Close()) // its sends end with n.life
	if n.ov != nil {
		errs = append(errs, n.ov.Close())
	}
	if n.asker != nil {
		n.asker.Close()
	}
	if n.h != nil {
		for _, id := range []protocol.ID{wire.StepProtocol(n.cfg.Job), wire.StepProtocolExt(n.cfg.Job), wire.ModelProtocol(n.cfg.Job), wire.ExchangeProtocol(n.cfg.Job)} {
			n.h.RemoveStreamHandler(id)
		}
		if n.conns != nil {
			n.h.Network().StopNotify(n.conns)
		}
		errs = append(errs, n.h.Close())
	}
	return errors.Join(errs...)
}
