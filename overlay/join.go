package overlay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/net/swarm"
	ma "github.com/multiformats/go-multiaddr"
	"github.com/prometheus/client_golang/prometheus"
)

// Joining through the bootstrap peers, and staying joined.
//
// New first joins as it always has (dialling every bootstrap peer in
// parallel, up to JoinTimeout). With KeepJoining, if none answers, the
// overlay does not fail: it starts alone but keeps the bootstrap peers,
// and a joiner goroutine
// dials them again with exponential backoff and jitter, logging each
// failure, until one answers; then it refreshes the routing table through
// it. There is one overlay either way, with the same bootstrap peers: the
// overlay's own rejoin (on an empty routing table) runs in both cases. The joiner then watches the routing table and
// dials the bootstrap peers again whenever it empties, and every
// SplitCheck dials one configured bootstrap peer that the overlay does not
// hold as a live member: two halves of a job that each kept one bootstrap
// peer meet again that way.

// JoinConfig sets how an overlay with KeepJoining joins through its
// bootstrap peers and stays joined.
type JoinConfig struct {
	// RetryMin and RetryMax bound the wait between two join attempts: it
	// starts at RetryMin, doubles after every failure up to RetryMax, and
	// each wait is drawn uniformly from [d/2, d] so that nodes started
	// together do not retry together. Until the node first joins, and for
	// at most FirstJoin after the joiner starts, it doubles only up to
	// max(RetryMin, 1 s): a node whose bootstrap peer starts a few
	// seconds after it joins within a second of that.
	RetryMin, RetryMax time.Duration
	FirstJoin          time.Duration
	// Check is how often a joined node looks at its routing table; an
	// empty one makes it join again.
	Check time.Duration
	// SplitCheck is how often a joined node dials one configured bootstrap
	// peer that it is neither connected to nor holds as a live member
	// (0: never).
	SplitCheck time.Duration
}

// DefaultJoinConfig retries from 100 ms up to 1 min, checks the routing
// table every 5 s and for a split every minute. The first retries come
// soon: nodes of a job started together (a harness, a scheduler, each
// trainer starting its own daemon) find their bootstrap peer not yet
// listening, and a refused dial on a network that answers costs
// nothing; a retry a second later was most of such a node's start-up.
func DefaultJoinConfig() JoinConfig {
	return JoinConfig{RetryMin: 100 * time.Millisecond, RetryMax: time.Minute, FirstJoin: time.Minute, Check: 5 * time.Second, SplitCheck: time.Minute}
}

// next is the backoff after a failed attempt that waited backoff: twice
// as long, up to RetryMax, and before the first join (first) up to
// max(RetryMin, 1 s).
func (c JoinConfig) next(backoff time.Duration, first bool) time.Duration {
	backoff = min(2*backoff, c.RetryMax)
	if first {
		backoff = min(backoff, max(c.RetryMin, time.Second))
	}
	return backoff
}

func (c JoinConfig) validate() error {
	if c.RetryMin <= 0 || c.RetryMax < c.RetryMin || c.Check <= 0 || c.SplitCheck < 0 || c.FirstJoin < 0 {
		return fmt.Errorf("Join.RetryMin %v, Join.RetryMax %v, Join.Check %v, Join.SplitCheck %v, Join.FirstJoin %v: need 0 < RetryMin <= RetryMax, Check > 0, SplitCheck >= 0, FirstJoin >= 0",
			c.RetryMin, c.RetryMax, c.Check, c.SplitCheck, c.FirstJoin)
	}
	return nil
}

// ParseBootstrap parses bootstrap multiaddrs (/ip4, /ip6, /dns, /dns4,
// /dns6 ... ending in /p2p/<id>) into one AddrInfo per peer. Addresses
// without a peer ID (HOST:PORT, see rendezvous.go) are checked and left
// out: their peers are learnt at the join. The error names the address at
// fault.
func ParseBootstrap(addrs []string) ([]peer.AddrInfo, error) {
	var out []peer.AddrInfo
	for _, s := range addrs {
		if IsRendezvous(s) { // an address alone: its peer ID is learnt at the join (rendezvous.go)
			if _, err := ParseRendezvous(s); err != nil {
				return nil, err
			}
			continue
		}
		a, err := ma.NewMultiaddr(s)
		if err != nil {
			return nil, fmt.Errorf("bootstrap address %q: %w", s, err)
		}
		ai, err := peer.AddrInfoFromP2pAddr(a)
		if err != nil {
			return nil, fmt.Errorf("bootstrap address %q: %w", s, err)
		}
		out = addInfo(out, *ai)
	}
	return out, nil
}

// addInfo adds ai to infos, merging its addresses into an entry of the
// same peer.
func addInfo(infos []peer.AddrInfo, ai peer.AddrInfo) []peer.AddrInfo {
	i := slices.IndexFunc(infos, func(o peer.AddrInfo) bool { return o.ID == ai.ID })
	if i < 0 {
		return append(infos, ai)
	}
	infos[i].Addrs = append(infos[i].Addrs, ai.Addrs...)
	return infos
}

// JoinStatus is how the join goes: a node's /status reports it.
type JoinStatus struct {
	// Joined: the routing table holds a peer (always true for a node with
	// no bootstrap peers: it starts the job). JoinError says why not: the
	// last attempt's error.
	Joined    bool   `json:"joined"`
	JoinError string `json:"join_error,omitempty"`
	// JoinAttempts counts the joiner's attempts since the last join.
	JoinAttempts    int    `json:"join_attempts"`
	LastJoinAttempt string `json:"last_join_attempt,omitempty"` // RFC 3339
	BootstrapPeers  int    `json:"bootstrap_peers"`
	// BootstrapRediscovered counts bootstrap peers met by the split check
	// that the overlay did not hold as live: a sign the job had split.
	BootstrapRediscovered uint64 `json:"bootstrap_rediscovered"`
}

// joiner keeps an overlay joined (see the top of this file). Its
// goroutine runs from start until its context ends (Close).
type joiner struct {
	o     *Overlay
	cfg   JoinConfig
	boot  []peer.AddrInfo
	rng   *rand.Rand // used by the goroutine only
	tries *prometheus.CounterVec
	found prometheus.Counter

	mu       sync.Mutex
	joined   bool
	err      string
	attempts int
	last     time.Time
	met      uint64
}

func newJoiner(o *Overlay, boot []peer.AddrInfo) *joiner {
	j := &joiner{
		o: o, cfg: o.cfg.Join, boot: boot,
		rng: newStream(o.cfg.Seed, streamJoin),
		tries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "psp", Name: "join_attempts_total",
			Help: "Attempts to join through the bootstrap peers after New, by result (ok, failed).",
		}, []string{"result"}),
		found: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "psp", Name: "join_bootstrap_rediscovered_total",
			Help: "Bootstrap peers the split check reached that the overlay did not hold as live members: a sign the job had split in two.",
		}),
	}
	reg := o.cfg.Registerer
	if reg == nil {
		reg = prometheus.NewRegistry() // counted, but not exported
	}
	reg.MustRegister(j.tries, j.found, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "psp", Name: "joined", Help: "1 when the node has joined the job's network (/status joined).",
	}, func() float64 {
		if j.status().Joined {
			return 1
		}
		return 0
	}))
	for _, r := range []string{"ok", "failed"} {
		j.tries.WithLabelValues(r) // export zeros, so a scrape shows the series
	}
	return j
}

// start runs the joiner, on the overlay's wait group, until ctx ends.
// joinErr is New's failure to join (nil if the overlay joined): the first
// retry then comes at once.
func (j *joiner) start(ctx context.Context, joinErr error) {
	j.mu.Lock()
	j.joined = joinErr == nil
	if joinErr != nil {
		j.err, j.attempts, j.last = j.explain(joinErr), 1, time.Now()
	}
	j.mu.Unlock()
	j.o.wg.Go(func() { j.run(ctx, joinErr != nil) })
}

func (j *joiner) run(ctx context.Context, retrying bool) {
	backoff := j.cfg.RetryMin
	everJoined, firstUntil := !retrying, time.Now().Add(j.cfg.FirstJoin)
	wait := j.cfg.Check
	if retrying {
		wait = j.spread(backoff)
	}
	nextSplit := time.Now().Add(j.cfg.SplitCheck)
	for {
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		if j.inNetwork() {
			j.setJoined()
			everJoined = true
			backoff, wait = j.cfg.RetryMin, j.cfg.Check
			if j.cfg.SplitCheck > 0 && !time.Now().Before(nextSplit) {
				j.checkSplit(ctx)
				nextSplit = time.Now().Add(j.cfg.SplitCheck)
			}
			continue
		}
		err := j.attempt(ctx)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			j.tries.WithLabelValues("ok").Inc()
			backoff, wait = j.cfg.RetryMin, j.cfg.Check
			if j.inNetwork() {
				j.setJoined()
				everJoined = true
			}
			continue
		}
		j.tries.WithLabelValues("failed").Inc()
		wait = j.spread(backoff)
		why := j.explain(err)
		j.mu.Lock()
		j.err = why
		n := j.attempts
		j.mu.Unlock()
		level := slog.LevelWarn
		if n > 1 && wait < time.Second { // the quick first retries: their first failure says it
			level = slog.LevelDebug
		}
		j.o.log.Log(ctx, level, "could not join through the bootstrap peers; retrying", "attempt", n, "retry_in", wait.Round(time.Millisecond), "err", why)
		backoff = j.cfg.next(backoff, !everJoined && time.Now().Before(firstUntil))
	}
}

// explain is the text of a failed join for the log, /status and /health:
// on one line, with Config.JoinHint's hint.
func (j *joiner) explain(err error) string {
	why := oneLine(err.Error())
	if h := j.o.cfg.JoinHint; h != nil {
		why += h(why)
	}
	return why
}

// oneLine puts an error text on one line: go-libp2p's dial errors list
// each address tried on a line of its own ("all dials failed\n  * [addr]
// why"), which broke a log line in two and /health's one-line reason.
func oneLine(s string) string {
	var parts []string
	for line := range strings.Lines(s) {
		line = strings.TrimSpace(line)
		line = strings.TrimSpace(strings.TrimPrefix(line, "* "))
		if line != "" {
			parts = append(parts, line)
		}
	}
	return strings.Join(parts, "; ")
}

// spread draws a wait uniformly from [d/2, d].
func (j *joiner) spread(d time.Duration) time.Duration {
	return d/2 + time.Duration(j.rng.Int64N(int64(d/2)+1))
}

// inNetwork reports whether the routing table holds a peer.
func (j *joiner) inNetwork() bool { return j.o.dht.RoutingTable().Size() > 0 }

func (j *joiner) setJoined() {
	j.mu.Lock()
	defer j.mu.Unlock()
	if !j.joined {
		j.o.log.Info("joined the job's network", "attempts", j.attempts)
	}
	j.joined, j.err, j.attempts = true, "", 0
}

// attempt dials every bootstrap peer in parallel (each up to the overlay's
// JoinTimeout); if one connects, it refreshes the routing table through
// it and waits (as long again) for the routing table to hold a peer.
func (j *joiner) attempt(ctx context.Context) error {
	j.mu.Lock()
	if j.joined {
		j.o.log.Warn("routing table empty: joining again through the bootstrap peers")
	}
	j.joined, j.last = false, time.Now()
	j.attempts++
	j.mu.Unlock()
	timeout := j.o.cfg.JoinTimeout
	ok, err := j.dial(ctx, j.boot, timeout, true)
	if len(ok) == 0 {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for !j.inNetwork() {
		if j.o.otherJob(ok) { // nothing to wait for
			return j.o.whyNotInNetwork(ok)
		}
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-rctx.Done():
			t.Stop()
			return j.o.whyNotInNetwork(ok)
		case <-t.C:
		}
	}
	j.refresh(rctx)
	return nil
}

// otherJob reports whether every peer of ok has identified itself (its
// protocols are known) without the job's DHT protocol: nodes of another
// job, which will never enter the routing table.
func (o *Overlay) otherJob(ok []peer.ID) bool {
	ps := o.h.Peerstore()
	for _, p := range ok {
		if protos, _ := ps.GetProtocols(p); len(protos) == 0 {
			return false
		}
		if has, _ := ps.SupportsProtocols(p, o.proto); len(has) > 0 {
			return false
		}
	}
	return len(ok) > 0
}

// refresh refreshes every bucket of the routing table, waiting until done
// or ctx ends.
func (j *joiner) refresh(ctx context.Context) {
	select {
	case <-j.o.dht.ForceRefresh():
	case <-ctx.Done():
	}
}

// whyNotInNetwork explains why bootstrap peers that accepted a connection
// did not enter the routing table.
func (o *Overlay) whyNotInNetwork(ok []peer.ID) error {
	proto := o.proto
	for _, p := range ok {
		if o.h.Network().Connectedness(p) != network.Connected {
			return fmt.Errorf("bootstrap peer %s closed the connection before identifying itself: is this node in its allowlist (--allow-peers)?", p)
		}
		if has, _ := o.h.Peerstore().SupportsProtocols(p, proto); len(has) == 0 {
			return fmt.Errorf("bootstrap peer %s does not speak %s: a node of another job (--job)?", p, proto)
		}
	}
	return errors.New("bootstrap peers connected but the routing table is still empty")
}

// dial connects to peers in parallel, each within timeout, and returns
// those that connected and, if none did, why; withAddrs, it first learns
// the peers at the bootstrap addresses given without a peer ID
// (rendezvous.go), within the same timeout, and dials them too. It clears the swarm's dial
// backoff for them first: after a failed dial go-libp2p refuses to dial an
// address again for 5 s and more (growing with each failure, up to 5 min),
// so that most retries on the joiner's schedule (RetryMin to RetryMax)
// failed with "dial backoff" and dialled nothing.
func (j *joiner) dial(ctx context.Context, peers []peer.AddrInfo, timeout time.Duration, withAddrs bool) ([]peer.ID, error) {
	dctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var why []string
	if withAddrs {
		learnt, errs := j.o.resolveRendezvous(dctx)
		peers = slices.Clone(peers)
		for _, ai := range learnt {
			peers = addInfo(peers, ai)
		}
		for _, err := range errs {
			why = append(why, err.Error())
		}
	}
	if b, ok := j.o.h.Network().(interface{ Backoff() *swarm.DialBackoff }); ok {
		for _, ai := range peers {
			b.Backoff().Clear(ai.ID)
		}
	}
	errs := make([]error, len(peers))
	var wg sync.WaitGroup
	for i, ai := range peers {
		wg.Go(func() { errs[i] = j.o.h.Connect(dctx, ai) })
	}
	wg.Wait()
	var ok []peer.ID
	for i, err := range errs {
		if err == nil {
			ok = append(ok, peers[i].ID)
		} else {
			why = append(why, fmt.Sprintf("%s: %v", peers[i].ID.ShortString(), err))
		}
	}
	if len(ok) > 0 {
		return ok, nil
	}
	return nil, fmt.Errorf("no bootstrap peer reachable (%d tried): %s", len(why), strings.Join(why, "; "))
}

// checkSplit dials one bootstrap peer, drawn at random among those the
// node is neither connected to nor holds as a live member. If it answers,
// the two were apart: the node refreshes its routing table through it.
func (j *joiner) checkSplit(ctx context.Context) {
	live := make(map[peer.ID]bool)
	for _, p := range j.o.Peers() {
		live[p] = true
	}
	cands := slices.Clone(j.boot)
	if j.o.rv.pending() {
		// The node at a bootstrap address may have been replaced since
		// (restarted with another identity, it started alone): ask the
		// addresses again.
		rctx, cancel := context.WithTimeout(ctx, j.o.cfg.JoinTimeout)
		learnt, _ := j.o.resolveRendezvous(rctx)
		cancel()
		cands = append(cands, learnt...)
	}
	var apart []peer.AddrInfo
	for _, ai := range cands {
		if !live[ai.ID] && j.o.h.Network().Connectedness(ai.ID) != network.Connected {
			apart = append(apart, ai)
		}
	}
	if len(apart) == 0 {
		return
	}
	ai := apart[j.rng.IntN(len(apart))]
	if ok, _ := j.dial(ctx, []peer.AddrInfo{ai}, j.o.cfg.JoinTimeout, false); len(ok) == 0 {
		return
	}
	j.found.Inc()
	j.mu.Lock()
	j.met++
	j.mu.Unlock()
	j.o.log.Warn("reached a bootstrap peer this node's overlay did not know: the job had split; merging", "peer", ai.ID)
	rctx, cancel := context.WithTimeout(ctx, j.o.cfg.JoinTimeout)
	defer cancel()
	j.refresh(rctx)
}

// status is the join's part of /status.
func (j *joiner) status() JoinStatus {
	joined := j.inNetwork()
	learnt := len(j.o.rv.learnt())
	j.mu.Lock()
	defer j.mu.Unlock()
	st := JoinStatus{Joined: joined, JoinAttempts: j.attempts, BootstrapPeers: len(j.boot) + learnt, BootstrapRediscovered: j.met}
	if !joined {
		st.JoinError = j.err
		if st.JoinError == "" {
			st.JoinError = "routing table empty"
		}
	}
	if !j.last.IsZero() {
		st.LastJoinAttempt = j.last.UTC().Format(time.RFC3339)
	}
	return st
}

// JoinStatus says how the join goes: joined (always, for an overlay with
// no bootstrap peers: it starts the job), and if not, why.
func (o *Overlay) JoinStatus() JoinStatus {
	if o.joiner == nil {
		return JoinStatus{Joined: true}
	}
	return o.joiner.status()
}
