package node

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/net/swarm"
	ma "github.com/multiformats/go-multiaddr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pspnode/pspnode/overlay"
)

// Joining through the bootstrap peers, and staying joined.
//
// New first lets the overlay join as it always has (dialling every
// bootstrap peer in parallel, up to Overlay.JoinTimeout). If none answers,
// the node does not fail: its overlay starts alone but keeps the
// bootstrap peers (overlay.Config.KeepJoining), and a joiner goroutine
// dials them again with exponential backoff and jitter, logging each
// failure, until one answers; then it refreshes the routing table through
// it. There is one overlay either way, with the same bootstrap peers: the
// overlay's own rejoin (on an empty routing table) runs in both cases. The joiner then watches the routing table and
// dials the bootstrap peers again whenever it empties, and every
// SplitCheck dials one configured bootstrap peer that the overlay does not
// hold as a live member: two halves of a job that each kept one bootstrap
// peer meet again that way.

// JoinConfig sets how a node joins through its bootstrap peers and stays
// joined.
type JoinConfig struct {
	// RetryMin and RetryMax bound the wait between two join attempts: it
	// starts at RetryMin, doubles after every failure up to RetryMax, and
	// each wait is drawn uniformly from [d/2, d] so that nodes started
	// together do not retry together.
	RetryMin, RetryMax time.Duration
	// Check is how often a joined node looks at its routing table; an
	// empty one makes it join again.
	Check time.Duration
	// SplitCheck is how often a joined node dials one configured bootstrap
	// peer that it is neither connected to nor holds as a live member
	// (0: never).
	SplitCheck time.Duration
}

// defaultJoinConfig retries from 1 s up to 1 min, checks the routing table
// every 5 s and for a split every minute.
func defaultJoinConfig() JoinConfig {
	return JoinConfig{RetryMin: time.Second, RetryMax: time.Minute, Check: 5 * time.Second, SplitCheck: time.Minute}
}

func (c JoinConfig) validate() error {
	if c.RetryMin <= 0 || c.RetryMax < c.RetryMin || c.Check <= 0 || c.SplitCheck < 0 {
		return fmt.Errorf("Join.RetryMin %v, Join.RetryMax %v, Join.Check %v, Join.SplitCheck %v: need 0 < RetryMin <= RetryMax, Check > 0, SplitCheck >= 0",
			c.RetryMin, c.RetryMax, c.Check, c.SplitCheck)
	}
	return nil
}

// ParseBootstrap parses bootstrap multiaddrs (/ip4, /ip6, /dns, /dns4,
// /dns6 ... ending in /p2p/<id>) into one AddrInfo per peer. The error
// names the address at fault.
func ParseBootstrap(addrs []string) ([]peer.AddrInfo, error) {
	var out []peer.AddrInfo
	for _, s := range addrs {
		a, err := ma.NewMultiaddr(s)
		if err != nil {
			return nil, fmt.Errorf("bootstrap address %q: %w", s, err)
		}
		if _, err := a.ValueForProtocol(ma.P_P2P); err != nil {
			return nil, fmt.Errorf("bootstrap address %q: must end in /p2p/<peer id> (run 'pspnode id --identity FILE' on the bootstrap node to print it)", s)
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

// JoinStatus is the join's part of /status.
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

// joiner keeps a node joined (see the top of this file). Its goroutine
// runs from start until its context ends; wait blocks until it has.
type joiner struct {
	n     *Node
	cfg   JoinConfig
	boot  []peer.AddrInfo
	rng   *rand.Rand // used by the goroutine only
	done  chan struct{}
	tries *prometheus.CounterVec
	found prometheus.Counter

	mu       sync.Mutex
	joined   bool
	err      string
	attempts int
	last     time.Time
	met      uint64
}

func newJoiner(n *Node, boot []peer.AddrInfo, seed uint64) *joiner {
	j := &joiner{
		n: n, cfg: n.cfg.Join, boot: boot,
		rng:  rand.New(rand.NewPCG(seed, 0x701e)),
		done: make(chan struct{}),
		tries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "psp", Name: "join_attempts_total",
			Help: "Attempts to join through the bootstrap peers after New, by result (ok, failed).",
		}, []string{"result"}),
		found: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "psp", Name: "join_bootstrap_rediscovered_total",
			Help: "Bootstrap peers the split check reached that the overlay did not hold as live members: a sign the job had split in two.",
		}),
	}
	n.reg.MustRegister(j.tries, j.found, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
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

// start runs the joiner until ctx ends. joinErr is New's failure to join
// (nil if the overlay joined): the first retry then comes at once.
func (j *joiner) start(ctx context.Context, joinErr error) {
	j.mu.Lock()
	j.joined = joinErr == nil
	if joinErr != nil {
		j.err, j.attempts, j.last = j.explain(joinErr), 1, time.Now()
	}
	j.mu.Unlock()
	go func() {
		defer close(j.done)
		j.run(ctx, joinErr != nil)
	}()
}

func (j *joiner) wait() { <-j.done }

func (j *joiner) run(ctx context.Context, retrying bool) {
	backoff := j.cfg.RetryMin
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
		j.n.log.Warn("could not join through the bootstrap peers; retrying", "attempt", n, "retry_in", wait.Round(time.Millisecond), "err", why)
		backoff = min(2*backoff, j.cfg.RetryMax)
	}
}

// explain is the text of a failed join for the log, /status and /health:
// on one line, with a hint when the failure looks like a swarm key
// missing or wrong.
func (j *joiner) explain(err error) string {
	return oneLine(err.Error()) + handshakeHint(err.Error(), len(j.n.cfg.PSK) > 0)
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

// negotiationFailed is how go-libp2p reports a connection whose first
// bytes were not the multistream-select negotiation of a security
// protocol: what a node without a swarm key reads from one with a key
// (its bytes are encrypted), and what two nodes with different keys read
// from each other.
const negotiationFailed = "failed to negotiate security protocol"

// handshakeHint says what a join failure's text suggests about swarm keys
// ("" for nothing), for a node with a key (private) or without.
func handshakeHint(err string, private bool) string {
	switch {
	case strings.Contains(err, negotiationFailed) && !private:
		return " (the connection was made but the security handshake failed: a private job's nodes answer so to a node without its swarm key; is --swarm-key missing?)"
	case strings.Contains(err, negotiationFailed):
		return " (the connection was made but the security handshake failed: does the bootstrap peer hold the same swarm key (--swarm-key)? a node with another key, or none, fails so)"
	case private && strings.Contains(err, "deadline exceeded"):
		return " (with a swarm key, a handshake with a node that has none hangs until the dial gives up: does the bootstrap peer run with the same --swarm-key?)"
	}
	return ""
}

// spread draws a wait uniformly from [d/2, d].
func (j *joiner) spread(d time.Duration) time.Duration {
	return d/2 + time.Duration(j.rng.Int64N(int64(d/2)+1))
}

// inNetwork reports whether the routing table holds a peer.
func (j *joiner) inNetwork() bool { return j.n.ov.DHT().RoutingTable().Size() > 0 }

func (j *joiner) setJoined() {
	j.mu.Lock()
	defer j.mu.Unlock()
	if !j.joined {
		j.n.log.Info("joined the job's network", "attempts", j.attempts)
	}
	j.joined, j.err, j.attempts = true, "", 0
}

// attempt dials every bootstrap peer in parallel (each up to the overlay's
// JoinTimeout); if one connects, it refreshes the routing table through
// it and waits (as long again) for the routing table to hold a peer.
func (j *joiner) attempt(ctx context.Context) error {
	j.mu.Lock()
	if j.joined {
		j.n.log.Warn("routing table empty: joining again through the bootstrap peers")
	}
	j.joined, j.last = false, time.Now()
	j.attempts++
	j.mu.Unlock()
	timeout := j.n.cfg.Overlay.JoinTimeout
	ok, err := j.dial(ctx, j.boot, timeout)
	if len(ok) == 0 {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for !j.inNetwork() {
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-rctx.Done():
			t.Stop()
			return j.whyNotInNetwork(ok)
		case <-t.C:
		}
	}
	j.refresh(rctx)
	return nil
}

// refresh refreshes every bucket of the routing table, waiting until done
// or ctx ends.
func (j *joiner) refresh(ctx context.Context) {
	select {
	case <-j.n.ov.DHT().ForceRefresh():
	case <-ctx.Done():
	}
}

// whyNotInNetwork explains why bootstrap peers that accepted a connection
// did not enter the routing table.
func (j *joiner) whyNotInNetwork(ok []peer.ID) error {
	proto := j.n.ov.Protocol()
	for _, p := range ok {
		if j.n.h.Network().Connectedness(p) != network.Connected {
			return fmt.Errorf("bootstrap peer %s closed the connection before identifying itself: is this node in its allowlist (--allow-peers)?", p)
		}
		if has, _ := j.n.h.Peerstore().SupportsProtocols(p, proto); len(has) == 0 {
			return fmt.Errorf("bootstrap peer %s does not speak %s: a node of another job (--job)?", p, proto)
		}
	}
	return errors.New("bootstrap peers connected but the routing table is still empty")
}

// dial connects to peers in parallel, each within timeout, and returns
// those that connected and, if none did, why. It clears the swarm's dial
// backoff for them first: after a failed dial go-libp2p refuses to dial an
// address again for 5 s and more (growing with each failure, up to 5 min),
// so that most retries on the joiner's schedule (RetryMin to RetryMax)
// failed with "dial backoff" and dialled nothing.
func (j *joiner) dial(ctx context.Context, peers []peer.AddrInfo, timeout time.Duration) ([]peer.ID, error) {
	dctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if b, ok := j.n.h.Network().(interface{ Backoff() *swarm.DialBackoff }); ok {
		for _, ai := range peers {
			b.Backoff().Clear(ai.ID)
		}
	}
	errs := make([]error, len(peers))
	var wg sync.WaitGroup
	for i, ai := range peers {
		wg.Go(func() { errs[i] = j.n.h.Connect(dctx, ai) })
	}
	wg.Wait()
	var ok []peer.ID
	var why []string
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
	return nil, fmt.Errorf("no bootstrap peer reachable (%d tried): %s", len(peers), strings.Join(why, "; "))
}

// checkSplit dials one bootstrap peer, drawn at random among those the
// node is neither connected to nor holds as a live member. If it answers,
// the two were apart: the node refreshes its routing table through it.
func (j *joiner) checkSplit(ctx context.Context) {
	live := make(map[peer.ID]bool)
	for _, p := range j.n.ov.Peers() {
		live[p] = true
	}
	var apart []peer.AddrInfo
	for _, ai := range j.boot {
		if !live[ai.ID] && j.n.h.Network().Connectedness(ai.ID) != network.Connected {
			apart = append(apart, ai)
		}
	}
	if len(apart) == 0 {
		return
	}
	ai := apart[j.rng.IntN(len(apart))]
	if ok, _ := j.dial(ctx, []peer.AddrInfo{ai}, j.n.cfg.Overlay.JoinTimeout); len(ok) == 0 {
		return
	}
	j.found.Inc()
	j.mu.Lock()
	j.met++
	j.mu.Unlock()
	j.n.log.Warn("reached a bootstrap peer this node's overlay did not know: the job had split; merging", "peer", ai.ID)
	rctx, cancel := context.WithTimeout(ctx, j.n.cfg.Overlay.JoinTimeout)
	defer cancel()
	j.refresh(rctx)
}

// status is the join's part of /status.
func (j *joiner) status() JoinStatus {
	joined := j.inNetwork()
	j.mu.Lock()
	defer j.mu.Unlock()
	st := JoinStatus{Joined: joined, JoinAttempts: j.attempts, BootstrapPeers: len(j.boot), BootstrapRediscovered: j.met}
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

// bootstrapPeers are the node's bootstrap peers: Bootstrap and the
// overlay's own, one AddrInfo per peer, without the node itself.
func (c Config) bootstrapPeers(self peer.ID) ([]peer.AddrInfo, error) {
	boot, err := ParseBootstrap(append(append([]string(nil), c.Bootstrap...), c.Overlay.BootstrapAddrs...))
	if err != nil {
		return nil, err
	}
	for _, ai := range c.Overlay.BootstrapPeers {
		boot = addInfo(boot, peer.AddrInfo{ID: ai.ID, Addrs: slices.Clone(ai.Addrs)})
	}
	return slices.DeleteFunc(boot, func(ai peer.AddrInfo) bool { return ai.ID == self }), nil
}

// newOverlay builds the overlay, joining through the bootstrap peers. If
// none answers, the overlay starts alone but keeps them (KeepJoining):
// newOverlay returns why, and the joiner keeps trying; the one overlay
// joins through the first that answers. err is any other failure.
func (n *Node) newOverlay(ctx context.Context) (joinErr, err error) {
	ov, err := overlay.New(ctx, n.h, overlayConfig(n.cfg, n.log))
	if err != nil {
		return nil, err
	}
	if joinErr = ov.JoinError(); joinErr != nil {
		n.log.Warn("no bootstrap peer answered: starting alone and retrying in the background", "err", joinErr)
	}
	n.ov = ov
	return joinErr, nil
}

// startJoiner starts the joiner of a node with bootstrap peers.
func (n *Node) startJoiner(joinErr error, seed uint64) {
	boot, err := n.cfg.bootstrapPeers(n.h.ID())
	if err != nil || len(boot) == 0 { // Validate parsed them
		return
	}
	n.joiner = newJoiner(n, boot, seed)
	n.joiner.start(n.life, joinErr)
}

// joinStatus is the join's part of /status.
func (n *Node) joinStatus() JoinStatus {
	if n.joiner == nil {
		return JoinStatus{Joined: true}
	}
	return n.joiner.status()
}

// serveHealth answers 200 once the node has joined, 503 with the reason
// before, and while it is isolated (isolation.go): a readiness probe.
func (n *Node) serveHealth(w http.ResponseWriter, _ *http.Request) {
	st := n.joinStatus()
	if !st.Joined {
		http.Error(w, "not joined: "+st.JoinError, http.StatusServiceUnavailable)
		return
	}
	if why := n.isolatedReason(); why != "" {
		http.Error(w, why, http.StatusServiceUnavailable)
		return
	}
	fmt.Fprintln(w, "joined")
}
