package overlay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	dht "github.com/libp2p/go-libp2p-kad-dht"
	pb "github.com/libp2p/go-libp2p-kad-dht/pb"
	kb "github.com/libp2p/go-libp2p-kbucket"
	"github.com/libp2p/go-libp2p/core/event"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-libp2p/p2p/host/eventbus"
)

// Errors returned by the overlay.
var (
	// ErrNotEnoughPeers is returned by Sample when fewer than β verified
	// live peers are available.
	ErrNotEnoughPeers = errors.New("overlay: not enough live peers to sample")
	// ErrJoin is returned by New when no bootstrap peer could be reached.
	ErrJoin = errors.New("overlay: could not reach any bootstrap peer")
	// ErrClosed is returned by calls on a closed Overlay.
	ErrClosed = errors.New("overlay: closed")
)

// protectTag is the connection-manager tag protecting connections to pool
// and zone peers: their disconnection is how departures are noticed.
const protectTag = "psp-overlay"

// member is one known peer.
type member struct {
	id        peer.ID
	key       []byte // SHA-256 of the peer ID: its DHT key
	cpl       int    // common-prefix length with self
	confirmed time.Time
	seenAt    time.Time
	dead      bool
	deadAt    time.Time
	retryAt   time.Time // next revival probe while dead
	liveIdx   int       // index in Overlay.live, -1 when dead
	poolIdx   int       // index in Overlay.pool, -1 when not in the pool
	verified  bool
	probing   bool
	// Pool announcements (pool.go): joined says the peer knows our pool
	// holds it; inDegree is how many pools hold it, as it said at degreeAt.
	joined   bool
	inDegree int
	degreeAt time.Time
}

// probeOp is what a probe job does.
type probeOp uint8

const (
	probeDial  probeOp = iota // dial: success is first-hand evidence of life
	probeJoin                 // pool join (pool.go): a dial that also learns the in-degree
	probeLeave                // pool leave, best effort
)

type probeJob struct {
	p   peer.ID
	op  probeOp
	seq uint64 // pool requests: the order they were decided in (pool.go)
}

type report struct {
	n  float64
	at time.Time
}

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
	pool      []*member
	protected map[peer.ID]bool
	lookups   []lookupSample
	reports   map[peer.ID]report
	inPool    map[peer.ID]inPoolEntry // last pool request applied per peer (pool.go)
	inDegree  int                     // entries of inPool whose pool holds us
	poolSeq   uint64                  // sequence number of our last pool request
	malformed int                     // malformed pool requests refused
	// confirmedByCPL counts live members with first-hand signs of life by
	// common-prefix length: the zone estimator's counts.
	confirmedByCPL [keyBits + 1]int
	zoneDepth      int
	ready          bool
	startedAt      time.Time
	joinedAt       time.Time
	lastRefresh    time.Time
	lastWalk       time.Time
	walks          int
	refreshes      int
	estCache       estCache
}

type estCache struct {
	at     time.Time
	n, se  float64
	err    error
	zone   zoneEstimate
	zerr   error
	ordN   float64
	ordSE  float64
	ordErr error
}

// New builds the job's DHT (server mode, protocol prefix /psp/<job>, no
// public bootstrap peers) over h and joins the network through the
// configured bootstrap peers, waiting at most JoinTimeout (and ctx) for at
// least one of them to connect. With no bootstrap peers the node starts a
// new network alone. The routing-table refresh, random walks, liveness
// probes and pool maintenance then run in the background until Close.
// Close does not close h: the caller owns the host.
func New(ctx context.Context, h host.Host, cfg Config) (*Overlay, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	boot, err := cfg.bootstrapInfos()
	if err != nil {
		return nil, err
	}
	boot = slices.DeleteFunc(boot, func(ai peer.AddrInfo) bool { return ai.ID == h.ID() })

	prefix := protocol.ID("/psp/" + cfg.Job)
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
	d, err := dht.New(h, opts...)
	if err != nil {
		return nil, fmt.Errorf("overlay: creating DHT: %w", err)
	}

	o := newOverlay(h, d, cfg, boot)
	cancel := o.cancel
	if o.pm, err = pb.NewProtocolMessenger(sender); err != nil {
		cancel()
		return nil, errors.Join(fmt.Errorf("overlay: DHT messenger: %w", err), d.Close())
	}

	sub, err := h.EventBus().Subscribe([]any{
		new(event.EvtPeerIdentificationCompleted),
		new(event.EvtPeerConnectednessChanged),
	}, eventbus.BufSize(1024))
	if err != nil {
		cancel()
		return nil, errors.Join(fmt.Errorf("overlay: subscribing to host events: %w", err), d.Close())
	}

	h.SetStreamHandler(o.poolProto, o.handlePool)
	if len(boot) > 0 {
		if err := o.connectBootstrap(ctx); err != nil {
			cancel()
			h.RemoveStreamHandler(o.poolProto)
			return nil, errors.Join(err, sub.Close(), d.Close())
		}
	} else {
		o.ready = true
		o.joinedAt = time.Now()
	}

	o.wg.Go(func() { o.eventLoop(sub) })
	for range cfg.ProbeConcurrency {
		o.wg.Go(o.probeLoop)
	}
	o.wg.Go(o.walkLoop)
	o.wg.Go(o.maintainLoop)
	return o, nil
}

// newOverlay builds the Overlay's state without starting anything.
func newOverlay(h host.Host, d *dht.IpfsDHT, cfg Config, boot []peer.AddrInfo) *Overlay {
	octx, cancel := context.WithCancel(context.Background())
	return &Overlay{
		cfg:       cfg,
		log:       cfg.logger().With("component", "overlay", "self", h.ID().ShortString()),
		h:         h,
		dht:       d,
		proto:     protocol.ID("/psp/"+cfg.Job) + "/kad/1.0.0",
		poolProto: poolProtocol(cfg.Job),
		selfKey:   kb.ConvertPeerID(h.ID()),
		bootstrap: boot,
		ctx:       octx,
		cancel:    cancel,
		probeCh:   make(chan probeJob, 1024),
		rng:       newStream(cfg.Seed, streamPool),
		walkRNG:   newStream(cfg.Seed, streamWalk),
		bucketRNG: newStream(cfg.Seed, streamBucket),
		jitterRNG: newStream(cfg.Seed, streamJitter),
		members:   make(map[peer.ID]*member),
		protected: make(map[peer.ID]bool),
		reports:   make(map[peer.ID]report),
		inPool:    make(map[peer.ID]inPoolEntry),
		startedAt: time.Now(),
	}
}

// connectBootstrap dials every bootstrap peer in parallel and succeeds if
// at least one connects within JoinTimeout.
func (o *Overlay) connectBootstrap(ctx context.Context) error {
	jctx, cancel := context.WithTimeout(ctx, o.cfg.JoinTimeout)
	defer cancel()
	errs := make(chan error, len(o.bootstrap))
	for _, ai := range o.bootstrap {
		go func() { errs <- o.h.Connect(jctx, ai) }()
	}
	var failures []error
	ok := 0
	for range o.bootstrap {
		if err := <-errs; err != nil {
			failures = append(failures, err)
		} else {
			ok++
		}
	}
	if ok == 0 {
		return fmt.Errorf("%w (%d tried): %w", ErrJoin, len(o.bootstrap), errors.Join(failures...))
	}
	o.log.Debug("connected to bootstrap peers", "ok", ok, "failed", len(failures))
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

// DHT returns the underlying Kademlia DHT (for inspection; do not close it).
func (o *Overlay) DHT() *dht.IpfsDHT { return o.dht }

// Protocol returns the DHT protocol ID this overlay speaks.
func (o *Overlay) Protocol() protocol.ID { return o.proto }

// ---------------------------------------------------------------------------
// Status

// Status is a snapshot of the overlay's health.
type Status struct {
	Ready            bool          // joined and the first refresh finished
	RoutingTableSize int           // peers in the Kademlia routing table
	Members          int           // known peers not known to be dead
	Dead             int           // peers currently held as dead
	Pool             int           // verified peers the sampler draws from
	InDegree         int           // peers whose pools hold this node (pool.go)
	MalformedPool    int           // malformed pool requests refused
	ZoneDepth        int           // depth c of the zone-density estimator
	Lookups          int           // random-walk lookups in the estimate window
	Reports          int           // fresh peer-reported estimates
	Walks            int           // random walks done since start
	Refreshes        int           // routing-table refreshes done since start
	LastRefresh      time.Time     // zero before the first refresh
	SinceRefresh     time.Duration // time since LastRefresh (since start if none)
}

// Status returns a snapshot of the overlay's state.
func (o *Overlay) Status() Status {
	rtSize := o.dht.RoutingTable().Size()
	o.mu.Lock()
	defer o.mu.Unlock()
	s := Status{
		Ready:            o.ready,
		RoutingTableSize: rtSize,
		Members:          len(o.live),
		Dead:             len(o.members) - len(o.live),
		ZoneDepth:        o.zoneDepth,
		Lookups:          len(o.lookups),
		Reports:          len(o.reports),
		Walks:            o.walks,
		Refreshes:        o.refreshes,
		InDegree:         o.inDegree,
		MalformedPool:    o.malformed,
		LastRefresh:      o.lastRefresh,
	}
	for _, m := range o.pool {
		if m.verified {
			s.Pool++
		}
	}
	if o.lastRefresh.IsZero() {
		s.SinceRefresh = time.Since(o.startedAt)
	} else {
		s.SinceRefresh = time.Since(o.lastRefresh)
	}
	return s
}

// Health returns nil when the overlay is usable: joined, connected to the
// network (or alone by design) and refreshed recently. Otherwise it says
// what is wrong.
func (o *Overlay) Health() error {
	s := o.Status()
	o.mu.Lock()
	closed := o.closed
	o.mu.Unlock()
	switch {
	case closed:
		return ErrClosed
	case !s.Ready:
		return errors.New("overlay: not ready: join or first refresh still running")
	case s.RoutingTableSize == 0 && len(o.bootstrap) > 0:
		return errors.New("overlay: routing table empty")
	case s.RoutingTableSize > 0 && s.SinceRefresh > 3*o.cfg.RefreshInterval+o.cfg.QueryTimeout:
		return fmt.Errorf("overlay: no routing-table refresh for %v", s.SinceRefresh.Round(time.Second))
	}
	return nil
}

// WaitReady blocks until the overlay is ready (joined and first refresh
// done) or ctx ends.
func (o *Overlay) WaitReady(ctx context.Context) error {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		o.mu.Lock()
		ready, closed := o.ready, o.closed
		o.mu.Unlock()
		switch {
		case closed:
			return ErrClosed
		case ready:
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("overlay: waiting for ready: %w", ctx.Err())
		case <-t.C:
		}
	}
}

// ---------------------------------------------------------------------------
// Sampling and membership API

// Sample returns beta distinct verified live peers other than self, drawn
// uniformly at random. It never blocks on the network: the draw is from the
// in-memory pool, which is kept a uniform random subset of every known live
// peer. It fails with ErrNotEnoughPeers when fewer than beta are available
// (raise PoolSize if beta exceeds it) and with ctx's error if ctx is done.
func (o *Overlay) Sample(ctx context.Context, beta int) ([]peer.ID, error) {
	if beta < 0 {
		return nil, fmt.Errorf("overlay: negative sample size %d", beta)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("overlay: sample: %w", err)
	}
	if beta == 0 {
		return []peer.ID{}, nil
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return nil, ErrClosed
	}
	// Weighted sampling without replacement (Efraimidis and Spirakis): each
	// member gets the key log(u)/w for a uniform u and its weight w, and the
	// beta largest keys win. Weights undo the spread of how many pools
	// hold each peer (pool.go); with every weight 1 this is a uniform draw.
	type keyed struct {
		id  peer.ID
		key float64
	}
	cand := make([]keyed, 0, len(o.pool))
	for _, m := range o.pool {
		if m.verified && !m.dead {
			cand = append(cand, keyed{m.id, math.Log(1-o.rng.Float64()) / o.weight(m)})
		}
	}
	if len(cand) < beta {
		return nil, fmt.Errorf("%w: want %d, have %d verified (pool size %d)", ErrNotEnoughPeers, beta, len(cand), o.cfg.PoolSize)
	}
	slices.SortFunc(cand, func(a, b keyed) int { return cmp.Compare(b.key, a.key) })
	out := make([]peer.ID, beta)
	for i := range out {
		out[i] = cand[i].id
	}
	return out, nil
}

// Peers returns every known peer not known to be dead that has shown first-
// hand signs of life at least once (answered us, connected to us, or was
// reported alive with MarkAlive): the population as this node knows it,
// for "BSP = sample everyone I know".
func (o *Overlay) Peers() []peer.ID {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make([]peer.ID, 0, len(o.live))
	for _, m := range o.live {
		if !m.confirmed.IsZero() {
			out = append(out, m.id)
		}
	}
	return out
}

// MarkDead records that p did not answer (e.g. a step query timed out). p
// leaves the sampler pool and the routing table at once; it returns only on
// first-hand evidence of life (it connects or answers again, or MarkAlive).
func (o *Overlay) MarkDead(p peer.ID) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if m, ok := o.members[p]; ok {
		o.markDeadLocked(m, time.Now(), "marked dead")
	}
}

// MarkAlive records first-hand evidence that p is alive (e.g. it answered
// a step query). A peer held as dead is revived.
func (o *Overlay) MarkAlive(p peer.ID) {
	if p == o.h.ID() || p == "" {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.touchLocked(p, true, time.Now())
}

// ObserveEstimate feeds the population estimate a peer reported (the step
// reply carries it). Nonsense values are ignored; the latest report per
// peer counts for ReportMaxAge. Peers should report LocalEstimate, not
// Estimate, so that reports stay independent. A report shows in Estimate
// within estCacheTTL: reports arrive with every step reply, and recomputing
// the estimate for each one cost 5 % of a 200-node testnet's CPU.
func (o *Overlay) ObserveEstimate(from peer.ID, n float64) {
	if from == o.h.ID() || math.IsNaN(n) || math.IsInf(n, 0) || n < 1 || n > 1e9 {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.reports[from] = report{n: n, at: time.Now()}
}

// ---------------------------------------------------------------------------
// Estimation

// estCacheTTL is how long a computed estimate is reused. Recomputing walks
// the member set; at 500 nodes in one process, with the 250 ms this was
// before, that was 5 % of the testnet's CPU. Estimates move over tens of
// seconds (EstimateWindow, ReportMaxAge), so a second's staleness is noise.
const estCacheTTL = time.Second

// LocalEstimate returns this node's own population estimate (N̂ including
// self) and its standard error: the zone-density estimate fused by inverse
// variance with the order-statistics estimate from random-key lookups.
// It returns ErrTooFewPeers when neither estimator has enough data.
func (o *Overlay) LocalEstimate() (n, stderr float64, err error) {
	c := o.estimates()
	if c.zerr != nil && c.ordErr != nil {
		return 0, 0, fmt.Errorf("overlay: local estimate: %w", ErrTooFewPeers)
	}
	var ns, ses []float64
	if c.zerr == nil {
		ns, ses = append(ns, c.zone.N), append(ses, c.zone.SE)
	}
	if c.ordErr == nil {
		ns, ses = append(ns, c.ordN), append(ses, c.ordSE)
	}
	n, se, _ := fuseIV(ns, ses)
	return n, se, nil
}

// Estimate returns the population estimate N̂ (self included) and its
// standard error: LocalEstimate fused with the fresh estimates peers
// reported through ObserveEstimate. It returns an error wrapping
// ErrTooFewPeers when there is too little data for an honest answer.
func (o *Overlay) Estimate() (n float64, stderr float64, err error) {
	c := o.estimates()
	return c.n, c.se, c.err
}

// EstimateDetail is the breakdown behind Estimate, for diagnostics.
type EstimateDetail struct {
	ZoneN, ZoneSE   float64 // zone density (0 if unavailable)
	ZoneDepth       int
	ZoneCount       int
	OrderN, OrderSE float64 // order statistics (0 if unavailable)
	Lookups         int
	Reports         int
	N, SE           float64 // fused
	Err             error
}

// EstimateDetail returns the estimators' separate results.
func (o *Overlay) EstimateDetail() EstimateDetail {
	c := o.estimates()
	o.mu.Lock()
	d := EstimateDetail{ZoneDepth: c.zone.Depth, ZoneCount: c.zone.Count, Lookups: len(o.lookups), Reports: len(o.reports), N: c.n, SE: c.se, Err: c.err}
	o.mu.Unlock()
	if c.zerr == nil {
		d.ZoneN, d.ZoneSE = c.zone.N, c.zone.SE
	}
	if c.ordErr == nil {
		d.OrderN, d.OrderSE = c.ordN, c.ordSE
	}
	return d
}

func (o *Overlay) estimates() estCache {
	now := time.Now()
	o.mu.Lock()
	if now.Sub(o.estCache.at) < estCacheTTL {
		c := o.estCache
		o.mu.Unlock()
		return c
	}
	o.mu.Unlock()

	rtPeers := o.dht.RoutingTable().ListPeers()

	o.mu.Lock()
	defer o.mu.Unlock()
	var c estCache
	c.at = now

	// Zone density: counts by CPL over live peers that have shown first-
	// hand signs of life (kept up to date as peers come and go, so this is
	// not a pass over every member) or are in the routing table;
	// fullness from the routing table's own buckets.
	counts := make([]int, keyBits+1)
	copy(counts, o.confirmedByCPL[:])
	rtCounts := make([]int, keyBits+1)
	for _, p := range rtPeers {
		if m, ok := o.members[p]; ok {
			rtCounts[m.cpl]++
			if !m.dead && m.confirmed.IsZero() {
				counts[m.cpl]++
			}
		} else {
			rtCounts[cpl(o.selfKey, kb.ConvertPeerID(p))]++
		}
	}
	full := make([]bool, keyBits+1)
	for j, n := range rtCounts {
		full[j] = n >= o.cfg.BucketSize
	}
	c.zone, c.zerr = estimateZone(counts, full, o.cfg.MinZonePeers)
	o.zoneDepth = c.zone.Depth

	// Order statistics over the MaxLookups most recent random-walk lookups
	// of the window (o.lookups is in time order).
	cut := now.Add(-o.cfg.EstimateWindow)
	o.lookups = slices.DeleteFunc(o.lookups, func(s lookupSample) bool { return s.At.Before(cut) })
	if extra := len(o.lookups) - o.cfg.MaxLookups; extra > 0 {
		o.lookups = slices.Delete(o.lookups, 0, extra)
	}
	c.ordN, c.ordSE, c.ordErr = estimateOrder(o.lookups, o.cfg.BucketSize, o.cfg.MinLookups)

	// Local fusion.
	var ns, ses []float64
	if c.zerr == nil {
		ns, ses = append(ns, c.zone.N), append(ses, c.zone.SE)
	}
	if c.ordErr == nil {
		ns, ses = append(ns, c.ordN), append(ses, c.ordSE)
	}
	ln, lse, lok := fuseIV(ns, ses)

	// Peer reports: the freshest MaxReports distinct peers (ties, which
	// are common when reports come in together, by peer ID rather than by
	// map order, so that the same reports give the same estimate).
	type rep struct {
		p  peer.ID
		n  float64
		at time.Time
	}
	var reps []rep
	rcut := now.Add(-o.cfg.ReportMaxAge)
	for p, r := range o.reports {
		if r.at.Before(rcut) {
			delete(o.reports, p)
			continue
		}
		if m, ok := o.members[p]; ok && m.dead {
			continue
		}
		reps = append(reps, rep{p: p, n: r.n, at: r.at})
	}
	slices.SortFunc(reps, func(a, b rep) int {
		if c := b.at.Compare(a.at); c != 0 {
			return c
		}
		return cmp.Compare(a.p, b.p)
	})
	if len(reps) > o.cfg.MaxReports {
		reps = reps[:o.cfg.MaxReports]
	}
	vals := make([]float64, len(reps))
	for i, r := range reps {
		vals[i] = r.n
	}
	c.n, c.se, c.err = fuseReports(ln, lse, lok, vals)
	if c.err != nil {
		c.err = fmt.Errorf("overlay: estimate: %w", c.err)
	}
	o.estCache = c
	return c
}

// ---------------------------------------------------------------------------
// Membership bookkeeping (all *Locked methods need o.mu)

// touchLocked records a sighting of p. First-hand sightings (p itself
// answered or connected) confirm it and revive it if held dead; third-party
// sightings (another node listed it) add it unverified and are ignored
// while it is held dead.
func (o *Overlay) touchLocked(p peer.ID, firstHand bool, now time.Time) *member {
	if p == o.h.ID() || p == "" || o.closed {
		return nil
	}
	m, ok := o.members[p]
	if !ok {
		key := kb.ConvertPeerID(p)
		m = &member{id: p, key: key, cpl: cpl(o.selfKey, key), liveIdx: -1, poolIdx: -1}
		o.members[p] = m
		m.dead = true // becomes live below
	}
	defer o.recountLocked(m, m.counted())
	m.seenAt = now
	if firstHand {
		m.confirmed = now
	}
	if m.dead {
		if ok && !firstHand && now.Sub(m.deadAt) < o.cfg.DeadHold {
			return m
		}
		m.dead = false
		m.liveIdx = len(o.live)
		o.live = append(o.live, m)
		o.estCache.at = time.Time{}
		o.offerToPoolLocked(m)
	}
	if firstHand && m.poolIdx >= 0 && !m.verified && o.connected(p) {
		m.verified = true
	}
	return m
}

// counted reports whether m counts for the zone estimator: live, with
// first-hand signs of life.
func (m *member) counted() bool { return !m.dead && !m.confirmed.IsZero() }

// recountLocked updates confirmedByCPL after a change to m, which counted
// for it before the change if was.
func (o *Overlay) recountLocked(m *member, was bool) {
	switch now := m.counted(); {
	case now && !was:
		o.confirmedByCPL[m.cpl]++
	case was && !now:
		o.confirmedByCPL[m.cpl]--
	}
}

func (o *Overlay) connected(p peer.ID) bool {
	return o.h.Network().Connectedness(p) == network.Connected
}

func (o *Overlay) markDeadLocked(m *member, now time.Time, why string) {
	if m.dead {
		return
	}
	o.log.Debug("peer dead", "peer", m.id.ShortString(), "why", why)
	defer o.recountLocked(m, m.counted())
	m.dead = true
	m.deadAt = now
	m.verified = false
	last := o.live[len(o.live)-1]
	o.live[m.liveIdx] = last
	last.liveIdx = m.liveIdx
	o.live = o.live[:len(o.live)-1]
	m.liveIdx = -1
	if m.poolIdx >= 0 {
		o.removeFromPoolLocked(m)
		o.refillPoolLocked()
	}
	delete(o.reports, m.id)
	o.estCache.at = time.Time{}
	o.dht.RoutingTable().RemovePeer(m.id)
}

// offerToPoolLocked is reservoir sampling over the stream of live peers:
// while the pool has room every peer enters; after that a new peer enters
// with probability PoolSize/|live|, replacing a uniform pool member. The
// pool thus stays a uniform random subset of all known live peers.
func (o *Overlay) offerToPoolLocked(m *member) {
	if m.poolIdx >= 0 || m.dead {
		return
	}
	if len(o.pool) < o.cfg.PoolSize {
		o.addToPoolLocked(m)
		return
	}
	if o.rng.IntN(len(o.live)) < o.cfg.PoolSize {
		o.removeFromPoolLocked(o.pool[o.rng.IntN(len(o.pool))])
		o.addToPoolLocked(m)
	}
}

// addToPoolLocked adds m to the pool and queues its join (pool.go). A peer
// connected and heard from within MaintainInterval is drawn at once; any
// other waits for the join to succeed.
func (o *Overlay) addToPoolLocked(m *member) {
	m.poolIdx = len(o.pool)
	o.pool = append(o.pool, m)
	m.verified = o.connected(m.id) && time.Since(m.confirmed) < o.cfg.MaintainInterval
	m.joined, m.inDegree, m.degreeAt = false, 0, time.Time{}
	o.enqueueProbeLocked(m)
}

func (o *Overlay) removeFromPoolLocked(m *member) {
	last := o.pool[len(o.pool)-1]
	o.pool[m.poolIdx] = last
	last.poolIdx = m.poolIdx
	o.pool = o.pool[:len(o.pool)-1]
	m.poolIdx = -1
	m.verified = false
	if m.joined && !m.dead {
		o.enqueueLeaveLocked(m.id)
	}
	m.joined, m.inDegree, m.degreeAt = false, 0, time.Time{}
}

// randomNonPoolLocked picks a uniform live peer outside the pool, or nil.
func (o *Overlay) randomNonPoolLocked() *member {
	outside := len(o.live) - len(o.pool)
	if outside <= 0 {
		return nil
	}
	if outside*4 >= len(o.live) {
		for range 64 {
			if m := o.live[o.rng.IntN(len(o.live))]; m.poolIdx < 0 {
				return m
			}
		}
	}
	var cand []*member
	for _, m := range o.live {
		if m.poolIdx < 0 {
			cand = append(cand, m)
		}
	}
	if len(cand) == 0 {
		return nil
	}
	return cand[o.rng.IntN(len(cand))]
}

func (o *Overlay) refillPoolLocked() {
	for len(o.pool) < o.cfg.PoolSize {
		m := o.randomNonPoolLocked()
		if m == nil {
			return
		}
		o.addToPoolLocked(m)
	}
}

// rotateLocked swaps a uniform pool member for a uniform live peer outside
// the pool, so that over time every peer passes through the pool.
func (o *Overlay) rotateLocked() {
	if len(o.pool) == 0 {
		return
	}
	m := o.randomNonPoolLocked()
	if m == nil {
		return
	}
	o.removeFromPoolLocked(o.pool[o.rng.IntN(len(o.pool))])
	o.addToPoolLocked(m)
}

// enqueueProbeLocked queues a liveness probe of m: a pool join for a pool
// member (which also learns its in-degree), a dial for anyone else.
func (o *Overlay) enqueueProbeLocked(m *member) {
	if m.probing || o.closed {
		return
	}
	job := probeJob{p: m.id, op: probeDial}
	if m.poolIdx >= 0 {
		o.poolSeq++
		job.op, job.seq = probeJoin, o.poolSeq
	}
	select {
	case o.probeCh <- job:
		m.probing = true
	default: // queue full: maintenance retries later
	}
}

// enqueueLeaveLocked queues a pool leave for p (best effort: if the queue
// is full, p drops us when our connection closes or the join goes stale).
func (o *Overlay) enqueueLeaveLocked(p peer.ID) {
	if o.closed {
		return
	}
	o.poolSeq++
	select {
	case o.probeCh <- probeJob{p: p, op: probeLeave, seq: o.poolSeq}:
	default:
	}
}

// ---------------------------------------------------------------------------
// Goroutines

// eventLoop turns host events into membership evidence: a peer that
// completes identify advertising our DHT protocol, or a known peer that
// connects, is alive; a pool or zone peer that disconnects is probed.
func (o *Overlay) eventLoop(sub event.Subscription) {
	defer sub.Close()
	for {
		select {
		case <-o.ctx.Done():
			return
		case e, ok := <-sub.Out():
			if !ok {
				return
			}
			now := time.Now()
			switch ev := e.(type) {
			case event.EvtPeerIdentificationCompleted:
				if slices.Contains(ev.Protocols, o.proto) {
					o.mu.Lock()
					o.touchLocked(ev.Peer, true, now)
					o.mu.Unlock()
				}
			case event.EvtPeerConnectednessChanged:
				o.mu.Lock()
				if ev.Connectedness != network.Connected {
					o.dropInLocked(ev.Peer) // its pool's hold on us ends with the connection
				}
				m, known := o.members[ev.Peer]
				if known {
					if ev.Connectedness == network.Connected {
						o.touchLocked(ev.Peer, true, now)
					} else if !m.dead && (m.poolIdx >= 0 || o.protected[m.id]) {
						// A pool member dropped our join with the
						// connection: the probe (a join) dials and
						// joins again.
						m.verified, m.joined = false, false
						o.enqueueProbeLocked(m)
					}
				}
				o.mu.Unlock()
			}
		}
	}
}

// probeLoop checks liveness by dialling, or for pool members by a pool
// join, and sends pool leaves. Success confirms the peer (and verifies it
// for the pool); failure marks it dead.
func (o *Overlay) probeLoop() {
	for {
		var job probeJob
		select {
		case <-o.ctx.Done():
			return
		case job = <-o.probeCh:
		}
		p := job.p
		var err error
		inDegree := 0
		switch job.op {
		case probeLeave:
			o.leave(p, job.seq)
			continue
		case probeJoin:
			inDegree, err = o.join(p, job.seq)
		default:
			ctx, cancel := context.WithTimeout(o.ctx, o.cfg.ProbeTimeout)
			err = o.h.Connect(ctx, peer.AddrInfo{ID: p})
			cancel()
		}
		if o.ctx.Err() != nil {
			return
		}
		now := time.Now()
		o.mu.Lock()
		m := o.members[p]
		if m != nil {
			m.probing = false
			o.probedLocked(m, job.op, inDegree, err, now)
		}
		o.mu.Unlock()
	}
}

// probedLocked applies a probe's outcome to m.
func (o *Overlay) probedLocked(m *member, op probeOp, inDegree int, err error, now time.Time) {
	alive := err == nil || errors.Is(err, errNoPoolProtocol)
	if !alive {
		o.markDeadLocked(m, now, "probe failed: "+err.Error())
		return
	}
	o.touchLocked(m.id, true, now)
	if op != probeJoin {
		if m.poolIdx >= 0 {
			m.verified = true
		}
		return
	}
	joined := err == nil
	if m.poolIdx < 0 {
		if joined { // it left our pool while the join was under way
			o.enqueueLeaveLocked(m.id)
		}
		return
	}
	m.verified = true
	m.joined, m.inDegree, m.degreeAt = joined, inDegree, now
}

// walkLoop finishes the join (first refresh) and then runs random-key
// lookups every WalkInterval (faster during warm-up) and a routing-table
// refresh every RefreshInterval.
func (o *Overlay) walkLoop() {
	o.finishJoin()
	// Refreshes are jittered ±50 % too: nodes started together would
	// otherwise all refresh in the same second, a CPU burst that shows as
	// slow barrier checks in a testnet of hundreds of nodes.
	jitter := func(d time.Duration) time.Duration {
		o.mu.Lock()
		defer o.mu.Unlock()
		return time.Duration(float64(d) * (0.5 + o.jitterRNG.Float64()))
	}
	nextRefresh := time.Now().Add(jitter(o.cfg.RefreshInterval))
	for {
		interval := o.cfg.WalkInterval
		o.mu.Lock()
		if time.Since(o.joinedAt) < o.cfg.WarmupPeriod {
			interval = o.cfg.WarmupWalkInterval
		}
		o.mu.Unlock()
		// Jitter ±50 % so that nodes do not walk in lock-step.
		wait := jitter(interval)
		t := time.NewTimer(wait)
		select {
		case <-o.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		if o.dht.RoutingTable().Size() == 0 && len(o.bootstrap) > 0 {
			if err := o.connectBootstrap(o.ctx); err != nil {
				o.log.Warn("rejoin failed", "err", err)
			}
		}
		if time.Now().After(nextRefresh) {
			o.refresh(false)
			nextRefresh = time.Now().Add(jitter(o.cfg.RefreshInterval))
		}
		o.walk()
	}
}

// finishJoin waits for the routing table to receive a bootstrap peer, then
// runs a full refresh (self-lookup and every bucket) and marks the overlay
// ready.
func (o *Overlay) finishJoin() {
	o.mu.Lock()
	ready := o.ready
	o.mu.Unlock()
	if !ready {
		deadline := time.Now().Add(o.cfg.JoinTimeout)
		for o.dht.RoutingTable().Size() == 0 && time.Now().Before(deadline) {
			select {
			case <-o.ctx.Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
		o.refresh(true)
		o.walk()
	}
	o.mu.Lock()
	o.ready = true
	o.joinedAt = time.Now()
	o.mu.Unlock()
}

// syncRoutingTable adds routing-table peers to the member set and drops
// peers we hold dead from the routing table.
func (o *Overlay) syncRoutingTable() {
	rt := o.dht.RoutingTable()
	peers := rt.ListPeers()
	now := time.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, p := range peers {
		if m := o.touchLocked(p, false, now); m != nil && m.dead {
			rt.RemovePeer(p)
		}
	}
}

// maintainLoop rotates the pool every RotateInterval and does housekeeping
// every MaintainInterval.
func (o *Overlay) maintainLoop() {
	rot := time.NewTicker(o.cfg.RotateInterval)
	defer rot.Stop()
	mt := time.NewTicker(o.cfg.MaintainInterval)
	defer mt.Stop()
	for {
		select {
		case <-o.ctx.Done():
			return
		case <-rot.C:
			o.mu.Lock()
			o.rotateLocked()
			o.mu.Unlock()
		case <-mt.C:
			o.syncRoutingTable()
			o.estimates() // refreshes the zone depth
			o.maintain()
		}
	}
}

// maintain re-probes unverified pool members, watches the estimator's
// zone (keeps connections to it, so departures there show at once),
// updates connection protection, dials a few dead peers again (RetryDead)
// and forgets long-dead peers.
func (o *Overlay) maintain() {
	rtPeers := o.dht.RoutingTable().ListPeers()
	now := time.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	want := make(map[peer.ID]bool, len(o.pool)+32)
	for _, m := range o.pool {
		want[m.id] = true
		if m.verified && !o.connected(m.id) {
			m.verified = false
		}
		// Unverified members are probed; the others join again once their
		// in-degree is old (degreeRefresh), which also keeps our place in
		// their count.
		if !m.verified || m.degreeAt.IsZero() || now.Sub(m.degreeAt) > o.degreeRefresh(m) {
			o.enqueueProbeLocked(m)
		}
	}
	for p, in := range o.inPool {
		if now.Sub(in.at) > 3*o.cfg.DegreeRefresh { // a lost leave, or an old one
			o.dropInLocked(p)
		}
	}
	// The zone: every live member at or below the zone depth is watched
	// (connected, protected, probed when not connected), so the zone
	// estimator counts it as confirmed and its departure shows at once.
	// Third-party sightings are included: our lookups ask only a few of
	// the peers near us and name the rest, and leaving those out read the
	// zone 13 % low at 1000 nodes. A zone of more than 2k members means
	// the depth is still shallow (the routing table is filling up after
	// the join: with no full bucket the zone is everyone we know of), and
	// then only its routing-table peers are watched: dialling every member
	// heard of at the join filled a 200-node TCP testnet's open files.
	var zone []*member
	for _, m := range o.live {
		if m.cpl >= o.zoneDepth {
			zone = append(zone, m)
		}
	}
	if len(zone) > 2*o.cfg.BucketSize {
		zone = zone[:0]
		for _, p := range rtPeers {
			if m, ok := o.members[p]; ok && !m.dead && m.cpl >= o.zoneDepth {
				zone = append(zone, m)
			}
		}
	}
	for _, m := range zone {
		want[m.id] = true
		if !o.connected(m.id) {
			o.enqueueProbeLocked(m)
		}
	}
	cm := o.h.ConnManager()
	for p := range o.protected {
		if !want[p] {
			cm.Unprotect(p, protectTag)
			delete(o.protected, p)
		}
	}
	for p := range want {
		if !o.protected[p] {
			cm.Protect(p, protectTag)
			o.protected[p] = true
		}
	}
	// Dial a few dead peers again now and then, RevivalProbes at most,
	// chosen at random among those due: a success revives a peer,
	// first-hand.
	var due []*member
	for p, m := range o.members {
		switch {
		case !m.dead:
		case now.Sub(m.deadAt) > 2*o.cfg.DeadHold:
			delete(o.members, p)
		case o.cfg.RetryDead > 0 && !now.Before(m.retryAt) && now.Sub(m.deadAt) >= o.cfg.RetryDead:
			due = append(due, m)
		}
	}
	// Map order is random but not seeded: sort, then draw from the pool
	// stream.
	slices.SortFunc(due, func(a, b *member) int { return cmp.Compare(a.id, b.id) })
	for i := range min(o.cfg.RevivalProbes, len(due)) {
		j := i + o.rng.IntN(len(due)-i)
		due[i], due[j] = due[j], due[i]
		due[i].retryAt = now.Add(o.cfg.RetryDead)
		o.enqueueProbeLocked(due[i])
	}
	o.refillPoolLocked()
}
