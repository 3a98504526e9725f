package overlay

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	dht "github.com/libp2p/go-libp2p-kad-dht"
	pb "github.com/libp2p/go-libp2p-kad-dht/pb"
	kb "github.com/libp2p/go-libp2p-kbucket"
	"github.com/libp2p/go-libp2p/core/event"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-libp2p/p2p/host/eventbus"

	"github.com/pspnode/pspnode/internal/wire"
)

// Errors returned by the overlay.
var (
	// ErrNotEnoughPeers is returned by Sample when fewer than β peers are
	// drawable (see Sample).
	ErrNotEnoughPeers = errors.New("overlay: not enough live peers to sample")
	// ErrJoin is returned by New when no bootstrap peer could be reached
	// (and, with KeepJoining, by JoinError).
	ErrJoin = errors.New("overlay: could not reach any bootstrap peer")
	// ErrClosed is returned by calls on a closed Overlay.
	ErrClosed = errors.New("overlay: closed")
)

// protectTag is the connection-manager tag protecting connections to pool
// and zone peers: their disconnection is how departures are noticed.
const protectTag = "psp-overlay"

// Overlay is one node's view of the job's DHT: membership, the population
// estimate, the peer sampler and liveness. It is safe for concurrent use.
type Overlay struct {
	cfg       Config
	log       *slog.Logger
	h         host.Host
	dht       *dht.IpfsDHT
	pm        *pb.ProtocolMessenger // FIND_NODE requests of our own walks
	proto     protocol.ID
	poolProto protocol.ID
	selfKey   []byte
	bootstrap []peer.AddrInfo
	joinErr   error                      // why New could not join (KeepJoining); set before New returns
	joiner    *joiner                    // keeps the overlay joined (KeepJoining with bootstrap peers); nil otherwise
	rv        rendezvousSet              // bootstrap peers known by address alone (rendezvous.go)
	mdns      interface{ Close() error } // mDNS discovery (mdns.go); nil when off
	mdnsCh    chan peer.AddrInfo         // peers mDNS found
	state     *peerState                 // the peers file (Config.PeersFile); nil without one

	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
	probeCh   chan probeJob

	mu        sync.Mutex
	closed    bool
	rng       *rand.Rand // pool draws (random.go has the streams)
	walkRNG   *rand.Rand // walk keys
	bucketRNG *rand.Rand // refresh keys of stale buckets
	jitterRNG *rand.Rand // walk and refresh timing
	members   map[peer.ID]*member
	live      []*member
	// draw holds every member Sample may draw and some that it no longer
	// may (their evidence aged out): members join it on first-hand
	// evidence, leave it when they die, and Sample drops the stale ones
	// it comes across (sampler.go).
	draw []*member
	// unconfirmed holds the members with no first-hand evidence of life,
	// least recently sighted first (membership.go), at most
	// MaxUnconfirmed of them.
	unconfirmed *list.List
	addrCount   map[string]int // live members per address group (diversity.go)
	crowded     int            // address groups in addrCount above PerAddress
	pool        []*member
	protected   map[peer.ID]bool
	lookups     []lookupSample
	reports     map[peer.ID]report
	inPool      map[peer.ID]inPoolEntry // last pool request applied per peer (pool.go)
	held        *heldOut                // peers held out (holdout.go); its own lock
	inDegree    int                     // entries of inPool whose pool holds us
	poolSeq     uint64                  // sequence number of our last pool request
	malformed   int                     // malformed pool requests refused
	// confirmedByCPL counts live members with first-hand signs of life by
	// common-prefix length: the zone estimator's counts.
	confirmedByCPL [keyBits + 1]int
	zoneDepth      int
	ready          bool
	startedAt      time.Time
	joinedAt       time.Time
	lastRefresh    time.Time
	walks          int
	refreshes      int
	estCache       estCache
}

// New builds the job's DHT (server mode, protocol prefix /psp/<job>, no
// public bootstrap peers) over h and joins the network through the
// configured bootstrap peers, waiting at most JoinTimeout (and ctx) for at
// least one of them to connect; if none does, New fails with ErrJoin, or
// with KeepJoining starts alone and keeps joining. With no bootstrap peers
// the node starts a new network alone. The routing-table refresh, random walks, liveness
// probes and pool maintenance then run in the background until Close.
// Close does not close h: the caller owns the host.
func New(ctx context.Context, h host.Host, cfg Config) (*Overlay, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	boot, err := cfg.Bootstrap()
	if err != nil {
		return nil, err
	}
	boot = slices.DeleteFunc(boot, func(ai peer.AddrInfo) bool { return ai.ID == h.ID() })
	if cfg.PeersFile != "" {
		// The peers remembered from the last run that answer join this
		// run's bootstrap peers (peersfile.go).
		for _, ai := range rememberedPeers(ctx, h, cfg) {
			boot = addInfo(boot, ai)
		}
	}

	prefix := wire.DHTPrefix(cfg.Job)
	held := newHeldOut()
	var sender *rpcSender
	opts := []dht.Option{
		dht.Mode(dht.ModeServer),
		dht.ProtocolPrefix(prefix),
		dht.BucketSize(cfg.BucketSize),
		dht.Concurrency(cfg.Concurrency),
		dht.Resiliency(cfg.Resiliency),
		// We schedule refreshes ourselves (join, then every
		// RefreshInterval); the period still sets which buckets count as
		// stale and when unheard-of peers get pinged.
		dht.DisableAutoRefresh(),
		dht.RoutingTableRefreshPeriod(cfg.RefreshInterval),
		dht.RoutingTableRefreshQueryTimeout(cfg.QueryTimeout),
		// Membership only: no provider or value records, so no record
		// stores, GC goroutines or datastores per node.
		dht.DisableProviders(),
		dht.DisableValues(),
		dht.RoutingTableFilter(held.routingFilter),
		// One stream per request instead of one kept open per peer
		// (rpc.go says why); our own walks use the same sender.
		dht.WithCustomMessageSender(func(h host.Host, protos []protocol.ID) pb.MessageSenderWithDisconnect {
			sender = newRPCSender(h, protos, cfg.QueryTimeout)
			return sender
		}),
	}
	if len(boot) > 0 {
		opts = append(opts, dht.BootstrapPeers(boot...))
	}
	if cfg.PerAddress > 0 {
		opts = append(opts, dht.RoutingTablePeerDiversityFilter(newRTAddrFilter(h, cfg.PerAddress)))
	}
	d, err := dht.New(h, opts...)
	if err != nil {
		return nil, fmt.Errorf("overlay: creating DHT: %w", err)
	}

	o := newOverlay(h, d, cfg, boot)
	o.held = held
	cancel := o.cancel
	o.rv.addrs, _ = cfg.rendezvous() // checked by cfg.Bootstrap
	o.dropOwnRendezvous()
	if cfg.MDNS != "" {
		if err := o.startMDNS(); err != nil {
			cancel()
			return nil, errors.Join(err, d.Close())
		}
		if len(boot) == 0 && !o.rv.pending() {
			// No one to join through: a peer found on the local
			// network in the first moments is one.
			o.bootstrap = o.awaitMDNS(ctx)
		}
	}
	if o.pm, err = pb.NewProtocolMessenger(sender); err != nil {
		o.closeMDNS()
		cancel()
		return nil, errors.Join(fmt.Errorf("overlay: DHT messenger: %w", err), d.Close())
	}

	sub, err := h.EventBus().Subscribe([]any{
		new(event.EvtPeerIdentificationCompleted),
		new(event.EvtPeerConnectednessChanged),
	}, eventbus.BufSize(1024))
	if err != nil {
		o.closeMDNS()
		cancel()
		return nil, errors.Join(fmt.Errorf("overlay: subscribing to host events: %w", err), d.Close())
	}

	h.SetStreamHandler(o.poolProto, o.handlePool)
	alone := !o.Joining()
	if !alone {
		err := o.connectBootstrap(ctx)
		switch {
		case err == nil:
			alone = !o.Joining() // its only bootstrap address was its own
		case cfg.KeepJoining && errors.Is(err, ErrJoin) && ctx.Err() == nil:
			o.joinErr, alone = err, true
			o.log.Debug("no bootstrap peer answered: starting alone, bootstrap peers kept", "err", err)
		default:
			o.closeMDNS()
			cancel()
			h.RemoveStreamHandler(o.poolProto)
			return nil, errors.Join(err, sub.Close(), d.Close())
		}
	}
	if alone { // nothing to wait for before the first walk
		o.ready = true
		o.joinedAt = time.Now()
	}

	o.wg.Go(func() { o.eventLoop(sub) })
	for range cfg.ProbeConcurrency {
		o.wg.Go(o.probeLoop)
	}
	o.wg.Go(o.walkLoop)
	o.wg.Go(o.maintainLoop)
	if o.mdns != nil {
		o.wg.Go(o.mdnsLoop)
	}
	if cfg.KeepJoining && o.Joining() {
		o.joiner = newJoiner(o, o.bootstrap)
		o.joiner.start(o.ctx, o.joinErr)
	}
	o.keepPeers()
	return o, nil
}

// newOverlay builds the Overlay's state without starting anything.
func newOverlay(h host.Host, d *dht.IpfsDHT, cfg Config, boot []peer.AddrInfo) *Overlay {
	octx, cancel := context.WithCancel(context.Background())
	return &Overlay{
		cfg:         cfg,
		log:         cfg.logger().With("component", "overlay", "self", h.ID().ShortString()),
		h:           h,
		dht:         d,
		proto:       wire.DHTProtocol(cfg.Job),
		poolProto:   poolProtocol(cfg.Job),
		selfKey:     kb.ConvertPeerID(h.ID()),
		bootstrap:   boot,
		ctx:         octx,
		cancel:      cancel,
		probeCh:     make(chan probeJob, 1024),
		rng:         newStream(cfg.Seed, streamPool),
		walkRNG:     newStream(cfg.Seed, streamWalk),
		bucketRNG:   newStream(cfg.Seed, streamBucket),
		jitterRNG:   newStream(cfg.Seed, streamJitter),
		members:     make(map[peer.ID]*member),
		unconfirmed: list.New(),
		addrCount:   make(map[string]int),
		protected:   make(map[peer.ID]bool),
		reports:     make(map[peer.ID]report),
		inPool:      make(map[peer.ID]inPoolEntry),
		held:        newHeldOut(),
		startedAt:   time.Now(),
	}
}

// connectBootstrap dials every bootstrap peer in parallel and succeeds if
// at least one connects within JoinTimeout.
func (o *Overlay) connectBootstrap(ctx context.Context) error {
	jctx, cancel := context.WithTimeout(ctx, o.cfg.JoinTimeout)
	defer cancel()
	learnt, failures := o.resolveRendezvous(jctx)
	targets := slices.Clone(o.bootstrap)
	for _, ai := range learnt {
		targets = addInfo(targets, ai)
	}
	if len(targets) == 0 && !o.Joining() {
		return nil // its only bootstrap address was its own: it starts the job
	}
	tried := len(targets) + len(failures)
	errs := make([]error, len(targets))
	var wg sync.WaitGroup
	for i, ai := range targets {
		wg.Go(func() { errs[i] = o.h.Connect(jctx, ai) }) // returns once the peer has identified itself
	}
	wg.Wait()
	var ok []peer.ID
	for i, err := range errs {
		if err != nil {
			failures = append(failures, err)
		} else {
			ok = append(ok, targets[i].ID)
		}
	}
	if len(ok) == 0 {
		return fmt.Errorf("%w (%d tried): %w", ErrJoin, tried, errors.Join(failures...))
	}
	if o.otherJob(ok) {
		return fmt.Errorf("%w: %w", ErrJoin, o.whyNotInNetwork(ok))
	}
	o.log.Debug("connected to bootstrap peers", "ok", len(ok), "failed", len(failures))
	return nil
}

// Close stops the overlay's goroutines and its DHT. It does not close the
// host. It is safe to call more than once.
func (o *Overlay) Close() error {
	o.closeOnce.Do(func() {
		o.mu.Lock()
		o.closed = true
		o.mu.Unlock()
		o.h.RemoveStreamHandler(o.poolProto)
		o.closeMDNS()
		o.cancel()
		o.wg.Wait()
		o.mu.Lock()
		for p := range o.protected {
			o.h.ConnManager().Unprotect(p, protectTag)
		}
		clear(o.protected)
		for p := range o.inPool {
			o.dropInLocked(p)
		}
		o.mu.Unlock()
		if err := o.dht.Close(); err != nil {
			o.closeErr = fmt.Errorf("overlay: closing DHT: %w", err)
		}
	})
	return o.closeErr
}

// BootstrapPeers are the peers the overlay joins through: the configured
// ones and those remembered in the peers file that answered, without this
// node.
func (o *Overlay) BootstrapPeers() []peer.AddrInfo {
	out := slices.Clone(o.bootstrap)
	for _, ai := range o.rv.learnt() {
		out = addInfo(out, ai)
	}
	return out
}

// JoinError is why New could not join through the bootstrap peers (with
// KeepJoining: it started alone and keeps joining), nil if it joined or
// had none to join through. It does not change once New has returned.
func (o *Overlay) JoinError() error { return o.joinErr }

// DHT returns the underlying Kademlia DHT (for inspection; do not close it).
func (o *Overlay) DHT() *dht.IpfsDHT { return o.dht }

// Protocol returns the DHT protocol ID this overlay speaks.
func (o *Overlay) Protocol() protocol.ID { return o.proto }
