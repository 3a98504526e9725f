package testnet

import (
	"bufio"
	"context"
	"crypto/rand"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-libp2p/p2p/transport/tcp"
	manet "github.com/multiformats/go-multiaddr/net"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pspnode/pspnode/internal/memnet"
	"github.com/pspnode/pspnode/internal/wire"
	"github.com/pspnode/pspnode/node"
	"github.com/pspnode/pspnode/testnet/plan"
	"github.com/pspnode/pspnode/testnet/report"
)

// The hogs' sizes, in all.
const (
	StreamHogPeers  = 80
	ConnHogPeers    = 300
	ConnHogHalfOpen = 100
	logFloodWorkers = 16
	// halfOpenHold is how long a half-open socket is held (go-libp2p's
	// handshake timeout).
	halfOpenHold = 15 * time.Second
	// freshEvery is how often the testnet tries a fresh peer against the
	// target while hogs run.
	freshEvery = 2 * time.Second
)

// hogCounts counts what the hogs did and what the fresh peers saw.
type hogCounts struct {
	identities   atomic.Int64  // hog identities up
	streamsOpen  atomic.Uint64 // step streams the stream hogs opened
	halfOpen     atomic.Uint64 // half-open sockets opened
	junk         atomic.Uint64 // junk connections opened
	freshTried   atomic.Uint64
	freshAnswerd atomic.Uint64
	targetMax    atomic.Int64 // the most connections the target held, read every freshEvery

	keysMu sync.Mutex
	keys   io.Reader // the hog identities' key stream
}

// hogShare is how many of total a node of role r takes: an even share
// among the initial nodes of that role (rounded up).
func (t *testnet) hogShare(r plan.Role, total int) int {
	k := 0
	for _, s := range t.cfg.Roles {
		if s.Role == r {
			k = max(1, int(s.Fraction*float64(t.cfg.Nodes)+0.5))
		}
	}
	if k == 0 {
		return 0
	}
	return (total + k - 1) / k
}

// hogHost makes a host of one more identity for node m's attack: on the
// mem transport a memnet host at m's address (a key of the run's hog key
// stream, so the honest nodes' keys and addresses stay those of the clean
// run), on the TCP transport a libp2p host that only dials (with the
// job's swarm key in a private testnet: fresh peers are of the job).
func (t *testnet) hogHost(m *member) (host.Host, error) {
	c := &t.hogs
	c.keysMu.Lock()
	if c.keys == nil {
		c.keys = memnet.KeySource(t.cfg.Seed, "testnet hog keys")
	}
	key, _, err := crypto.GenerateEd25519Key(c.keys)
	c.keysMu.Unlock()
	if err != nil {
		return nil, err
	}
	if t.net != nil {
		var ip net.IP
		for _, a := range m.nd.Host().Addrs() {
			if v, err := manet.ToIP(a); err == nil {
				ip = v
				break
			}
		}
		return t.net.NewHostWith(memnet.HostOptions{Low: 1, High: 4, Key: key, IP: ip})
	}
	opts := []libp2p.Option{libp2p.Identity(key), libp2p.NoListenAddrs, libp2p.Transport(tcp.NewTCPTransport),
		libp2p.ResourceManager(&network.NullResourceManager{}), libp2p.DisableRelay(), libp2p.DisableMetrics()}
	if t.cfg.Private {
		opts = append(opts, libp2p.PrivateNetwork(testnetPSK(t.cfg.Seed)))
	}
	return libp2p.New(opts...)
}

// targetInfo is the flood target's identity and addresses.
func (t *testnet) targetInfo() peer.AddrInfo {
	return peer.AddrInfo{ID: t.target.nd.ID(), Addrs: t.target.nd.Addrs()}
}

// streamHog is a stream-hog node's attack, until ctx ends.
func (t *testnet) streamHog(ctx context.Context, m *member) {
	ai := t.targetInfo()
	proto := wire.StepProtocolExt("testnet")
	var wg sync.WaitGroup
	for range t.hogShare(plan.StreamHog, StreamHogPeers) {
		h, err := t.hogHost(m)
		if err != nil {
			t.log.Warn("stream hog: no host", "err", err)
			continue
		}
		t.hogs.identities.Add(1)
		wg.Go(func() {
			defer h.Close()
			var hw sync.WaitGroup
			for range node.DefaultConfig().Limits.MaxStreamsPerPeer {
				hw.Go(func() { t.holdStreams(ctx, h, ai, proto) })
			}
			hw.Wait()
		})
	}
	wg.Wait()
}

// holdStreams holds one idle step stream on the target at a time, until
// ctx ends.
func (t *testnet) holdStreams(ctx context.Context, h host.Host, ai peer.AddrInfo, proto protocol.ID) {
	buf := make([]byte, 1)
	for ctx.Err() == nil {
		if h.Network().Connectedness(ai.ID) != network.Connected {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := h.Connect(cctx, ai)
			cancel()
			if err != nil {
				sleepCtx(ctx, time.Second)
				continue
			}
		}
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		s, err := h.NewStream(sctx, ai.ID, proto)
		cancel()
		if err != nil {
			sleepCtx(ctx, 250*time.Millisecond)
			continue
		}
		t.hogs.streamsOpen.Add(1)
		stop := context.AfterFunc(ctx, func() { _ = s.Reset() })
		start := time.Now()
		_, _ = s.Read(buf) // until the target resets it
		stop()
		_ = s.Reset()
		if time.Since(start) < 100*time.Millisecond {
			sleepCtx(ctx, 250*time.Millisecond) // refused at once
		} else {
			sleepCtx(ctx, floodPause)
		}
	}
}

// connHog is a conn-hog node's attack, until ctx ends.
func (t *testnet) connHog(ctx context.Context, m *member) {
	ai := t.targetInfo()
	var wg sync.WaitGroup
	if addr := t.targetTCP(); addr != "" {
		for range t.hogShare(plan.ConnHog, ConnHogHalfOpen) {
			wg.Go(func() { t.halfOpen(ctx, addr) })
		}
	}
	for range t.hogShare(plan.ConnHog, ConnHogPeers) {
		if ctx.Err() != nil {
			break
		}
		h, err := t.hogHost(m)
		if err != nil {
			t.log.Warn("conn hog: no host", "err", err)
			continue
		}
		t.hogs.identities.Add(1)
		wg.Go(func() {
			defer h.Close()
			for ctx.Err() == nil {
				if h.Network().Connectedness(ai.ID) != network.Connected {
					cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
					_ = h.Connect(cctx, ai)
					cancel()
				}
				sleepCtx(ctx, time.Second)
			}
		})
	}
	wg.Wait()
}

// targetTCP is the target's TCP address (host:port), "" off the TCP
// transport.
func (t *testnet) targetTCP() string {
	if t.net != nil {
		return ""
	}
	for _, a := range t.target.nd.Addrs() {
		if ta, _ := peer.SplitAddr(a); ta != nil {
			a = ta
		}
		if na, err := manet.ToNetAddr(a); err == nil {
			if _, ok := na.(*net.TCPAddr); ok {
				return na.String()
			}
		}
	}
	return ""
}

// halfOpen holds one half-open socket to addr at a time, until ctx ends.
func (t *testnet) halfOpen(ctx context.Context, addr string) {
	var d net.Dialer
	for ctx.Err() == nil {
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		c, err := d.DialContext(dctx, "tcp", addr)
		cancel()
		if err != nil {
			sleepCtx(ctx, time.Second)
			continue
		}
		t.hogs.halfOpen.Add(1)
		stop := context.AfterFunc(ctx, func() { _ = c.Close() })
		_ = c.SetReadDeadline(time.Now().Add(halfOpenHold))
		_, _ = io.Copy(io.Discard, c) // until the target closes it, or the hold ends
		stop()
		_ = c.Close()
		sleepCtx(ctx, floodPause)
	}
}

// logFlood is a log-flood node's attack, until ctx ends.
func (t *testnet) logFlood(ctx context.Context, m *member) {
	addr := t.targetTCP()
	if addr == "" {
		return
	}
	var wg sync.WaitGroup
	for range logFloodWorkers {
		wg.Go(func() {
			var d net.Dialer
			junk := make([]byte, 64)
			for ctx.Err() == nil {
				dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				c, err := d.DialContext(dctx, "tcp", addr)
				cancel()
				if err != nil {
					sleepCtx(ctx, 50*time.Millisecond)
					continue
				}
				t.hogs.junk.Add(1)
				_, _ = rand.Read(junk)
				_, _ = c.Write(junk)
				_ = c.Close()
			}
		})
	}
	wg.Wait()
}

// freshPeers tries a fresh peer against the target every freshEvery while
// hogs run, until ctx ends: a new identity connects and asks its step.
func (t *testnet) freshPeers(ctx context.Context, m *member) {
	ai := t.targetInfo()
	tick := time.NewTicker(freshEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		h, err := t.hogHost(m)
		if err != nil {
			continue
		}
		err = freshQuery(ctx, h, ai)
		if ctx.Err() == nil { // one cut by the run's end says nothing
			t.hogs.freshTried.Add(1)
			if err == nil {
				t.hogs.freshAnswerd.Add(1)
			}
		}
		_ = h.Close()
		if k := len(t.target.nd.Host().Network().Conns()); int64(k) > t.hogs.targetMax.Load() {
			t.hogs.targetMax.Store(int64(k))
		}
	}
}

// freshQuery connects h to ai and asks its step once.
func freshQuery(ctx context.Context, h host.Host, ai peer.AddrInfo) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := h.Connect(ctx, ai); err != nil {
		return err
	}
	s, err := h.NewStream(ctx, ai.ID, wire.StepProtocol("testnet"))
	if err != nil {
		return err
	}
	defer bound(s)()
	if err := wire.WriteFrame(s, wire.MarshalStepRequest(wire.StepRequest{Step: 0})); err != nil {
		_ = s.Reset()
		return err
	}
	if _, err := wire.ReadFrame(bufio.NewReader(s), wire.MaxStepFrame); err != nil {
		_ = s.Reset()
		return err
	}
	return s.Close()
}

// warnCounter is a slog handler that counts the records at Warn and above
// (and the bytes they take as text) before passing them on to next.
type warnCounter struct {
	next  slog.Handler
	lines *atomic.Uint64
	bytes *atomic.Uint64
}

func (w warnCounter) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn || w.next.Enabled(ctx, l)
}

func (w warnCounter) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		w.lines.Add(1)
		var cw countWriter
		_ = slog.NewTextHandler(&cw, nil).Handle(ctx, r)
		w.bytes.Add(uint64(cw))
	}
	if w.next.Enabled(ctx, r.Level) {
		return w.next.Handle(ctx, r)
	}
	return nil
}

func (w warnCounter) WithAttrs(as []slog.Attr) slog.Handler {
	return warnCounter{next: w.next.WithAttrs(as), lines: w.lines, bytes: w.bytes}
}

func (w warnCounter) WithGroup(g string) slog.Handler {
	return warnCounter{next: w.next.WithGroup(g), lines: w.lines, bytes: w.bytes}
}

type countWriter int

func (c *countWriter) Write(p []byte) (int, error) { *c += countWriter(len(p)); return len(p), nil }

// hogFigures returns the hogs' figures, nil without hogs. t.mu is held.
func (t *testnet) hogFigures() *report.HogFigures {
	if !t.hasRole(plan.StreamHog, plan.ConnHog, plan.LogFlood) || t.target == nil {
		return nil
	}
	c := &t.hogs
	st := t.target.nd.Status()
	return &report.HogFigures{Identities: c.identities.Load(), StreamsOpened: c.streamsOpen.Load(), HalfOpenSockets: c.halfOpen.Load(),
		JunkConnections: c.junk.Load(), FreshTried: c.freshTried.Load(), FreshAnswered: c.freshAnswerd.Load(),
		TargetConnectionsMax: c.targetMax.Load(), TargetTrimmed: st.ConnectionsTrimmed,
		TargetEvicted: uint64(counterOf(t.target.nd.Registry(), "psp_hostile_messages_total", "kind", "step_stream_evicted"))}
}

// hasRole reports whether the run has nodes of any of rs.
func (t *testnet) hasRole(rs ...plan.Role) bool {
	for _, s := range t.cfg.Roles {
		for _, r := range rs {
			if s.Role == r {
				return true
			}
		}
	}
	return false
}

// counterOf is the value of the counter name{label=value} in reg (0 if
// absent).
func counterOf(reg *prometheus.Registry, name, label, value string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		return 0
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label == "" {
				return m.GetCounter().GetValue()
			}
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
