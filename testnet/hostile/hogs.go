package hostile

import (
	"bufio"
	"context"
	"crypto/rand"
	"io"
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

	"github.com/pspnode/pspnode/internal/memnet"
	"github.com/pspnode/pspnode/internal/vclock"
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
func (p *Play) hogShare(r plan.Role, total int) int {
	k := 0
	for _, s := range p.cfg.Roles {
		if s.Role == r {
			k = max(1, int(s.Fraction*float64(p.cfg.Nodes)+0.5))
		}
	}
	if k == 0 {
		return 0
	}
	return (total + k - 1) / k
}

// hogHost makes a host of one more identity for node nd's attack: on the
// mem transport a memnet host at nd's address (a key of the run's hog key
// stream, so the honest nodes' keys and addresses stay those of the clean
// run), on the TCP transport a libp2p host that only dials (with the
// job's swarm key in a private testnet: fresh peers are of the job).
func (p *Play) hogHost(nd *node.Node) (host.Host, error) {
	c := &p.hogs
	c.keysMu.Lock()
	if c.keys == nil {
		c.keys = memnet.KeySource(p.cfg.Seed, "testnet hog keys")
	}
	key, _, err := crypto.GenerateEd25519Key(c.keys)
	c.keysMu.Unlock()
	if err != nil {
		return nil, err
	}
	if p.mem != nil {
		var ip net.IP
		for _, a := range nd.Host().Addrs() {
			if v, err := manet.ToIP(a); err == nil {
				ip = v
				break
			}
		}
		return p.mem.NewHostWith(memnet.HostOptions{Low: 1, High: 4, Key: key, IP: ip})
	}
	opts := []libp2p.Option{libp2p.Identity(key), libp2p.NoListenAddrs, libp2p.Transport(tcp.NewTCPTransport),
		libp2p.ResourceManager(&network.NullResourceManager{}), libp2p.DisableRelay(), libp2p.DisableMetrics()}
	if p.cfg.Private {
		opts = append(opts, libp2p.PrivateNetwork(plan.PSK(p.cfg.Seed)))
	}
	return libp2p.New(opts...)
}

// targetInfo is the flood target's identity and addresses.
func (p *Play) targetInfo() peer.AddrInfo {
	return peer.AddrInfo{ID: p.target.ID(), Addrs: p.target.Addrs()}
}

// streamHog is a stream-hog node's attack, until ctx ends.
func (p *Play) streamHog(ctx context.Context, nd *node.Node) {
	ai := p.targetInfo()
	proto := wire.StepProtocolExt("testnet")
	var wg sync.WaitGroup
	for range p.hogShare(plan.StreamHog, StreamHogPeers) {
		h, err := p.hogHost(nd)
		if err != nil {
			p.log.Warn("stream hog: no host", "err", err)
			continue
		}
		p.hogs.identities.Add(1)
		wg.Go(func() {
			defer h.Close()
			var hw sync.WaitGroup
			for range node.DefaultConfig().Limits.MaxStreamsPerPeer {
				hw.Go(func() { p.holdStreams(ctx, h, ai, proto) })
			}
			hw.Wait()
		})
	}
	wg.Wait()
}

// holdStreams holds one idle step stream on the target at a time, until
// ctx ends.
func (p *Play) holdStreams(ctx context.Context, h host.Host, ai peer.AddrInfo, proto protocol.ID) {
	buf := make([]byte, 1)
	for ctx.Err() == nil {
		if h.Network().Connectedness(ai.ID) != network.Connected {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := h.Connect(cctx, ai)
			cancel()
			if err != nil {
				vclock.Sleep(ctx, time.Second)
				continue
			}
		}
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		s, err := h.NewStream(sctx, ai.ID, proto)
		cancel()
		if err != nil {
			vclock.Sleep(ctx, 250*time.Millisecond)
			continue
		}
		p.hogs.streamsOpen.Add(1)
		stop := context.AfterFunc(ctx, func() { _ = s.Reset() })
		start := time.Now()
		_, _ = s.Read(buf) // until the target resets it
		stop()
		_ = s.Reset()
		if time.Since(start) < 100*time.Millisecond {
			vclock.Sleep(ctx, 250*time.Millisecond) // refused at once
		} else {
			vclock.Sleep(ctx, floodPause)
		}
	}
}

// connHog is a conn-hog node's attack, until ctx ends.
func (p *Play) connHog(ctx context.Context, nd *node.Node) {
	ai := p.targetInfo()
	var wg sync.WaitGroup
	if addr := p.targetTCP(); addr != "" {
		for range p.hogShare(plan.ConnHog, ConnHogHalfOpen) {
			wg.Go(func() { p.halfOpen(ctx, addr) })
		}
	}
	for range p.hogShare(plan.ConnHog, ConnHogPeers) {
		if ctx.Err() != nil {
			break
		}
		h, err := p.hogHost(nd)
		if err != nil {
			p.log.Warn("conn hog: no host", "err", err)
			continue
		}
		p.hogs.identities.Add(1)
		wg.Go(func() {
			defer h.Close()
			for ctx.Err() == nil {
				if h.Network().Connectedness(ai.ID) != network.Connected {
					cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
					_ = h.Connect(cctx, ai)
					cancel()
				}
				vclock.Sleep(ctx, time.Second)
			}
		})
	}
	wg.Wait()
}

// targetTCP is the target's TCP address (host:port), "" off the TCP
// transport.
func (p *Play) targetTCP() string {
	if p.mem != nil {
		return ""
	}
	for _, a := range p.target.Addrs() {
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
func (p *Play) halfOpen(ctx context.Context, addr string) {
	var d net.Dialer
	for ctx.Err() == nil {
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		c, err := d.DialContext(dctx, "tcp", addr)
		cancel()
		if err != nil {
			vclock.Sleep(ctx, time.Second)
			continue
		}
		p.hogs.halfOpen.Add(1)
		stop := context.AfterFunc(ctx, func() { _ = c.Close() })
		_ = c.SetReadDeadline(time.Now().Add(halfOpenHold))
		_, _ = io.Copy(io.Discard, c) // until the target closes it, or the hold ends
		stop()
		_ = c.Close()
		vclock.Sleep(ctx, floodPause)
	}
}

// logFlood is a log-flood node's attack, until ctx ends.
func (p *Play) logFlood(ctx context.Context, nd *node.Node) {
	addr := p.targetTCP()
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
					vclock.Sleep(ctx, 50*time.Millisecond)
					continue
				}
				p.hogs.junk.Add(1)
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
// Each try runs on a goroutine of its own (ended by its deadline or ctx,
// and waited for), so that one slow try does not hold back the next: a
// fresh peer of a real job would not wait for another's to time out.
func (p *Play) freshPeers(ctx context.Context, nd *node.Node) {
	ai := p.targetInfo()
	tick := time.NewTicker(freshEvery)
	defer tick.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		h, err := p.hogHost(nd)
		if err != nil {
			continue
		}
		wg.Go(func() {
			defer h.Close()
			err := freshQuery(ctx, h, ai)
			if ctx.Err() == nil { // one cut by the run's end says nothing
				p.hogs.freshTried.Add(1)
				if err == nil {
					p.hogs.freshAnswerd.Add(1)
				}
			}
			k := int64(len(p.target.Host().Network().Conns()))
			for m := p.hogs.targetMax.Load(); k > m && !p.hogs.targetMax.CompareAndSwap(m, k); m = p.hogs.targetMax.Load() {
			}
		})
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

// hogFigures returns the hogs' figures, nil without hogs.
func (p *Play) hogFigures() *report.HogFigures {
	if !p.cfg.HasRole(plan.StreamHog, plan.ConnHog, plan.LogFlood) || p.target == nil {
		return nil
	}
	c := &p.hogs
	st := p.target.Status()
	return &report.HogFigures{Identities: c.identities.Load(), StreamsOpened: c.streamsOpen.Load(), HalfOpenSockets: c.halfOpen.Load(),
		JunkConnections: c.junk.Load(), FreshTried: c.freshTried.Load(), FreshAnswered: c.freshAnswerd.Load(),
		TargetConnectionsMax: c.targetMax.Load(), TargetTrimmed: st.ConnectionsTrimmed,
		TargetEvicted: uint64(report.CounterOf(p.target.Registry(), "psp_hostile_messages_total", "kind", "step_stream_evicted"))}
}
