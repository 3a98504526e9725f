package hostile

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/hex"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	pb "github.com/libp2p/go-libp2p-kad-dht/pb"
	kbucket "github.com/libp2p/go-libp2p-kbucket"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/pspnode/pspnode/internal/lineage"
	"github.com/pspnode/pspnode/internal/vclock"
	"github.com/pspnode/pspnode/internal/wire"
	"github.com/pspnode/pspnode/node"
	"github.com/pspnode/pspnode/psp"
	"github.com/pspnode/pspnode/testnet/plan"
	"github.com/pspnode/pspnode/testnet/report"
)

// The impostors' claims.
const (
	HijackStep  int64   = 5_000_000
	HijackValue float64 = 50
	WedgeStep   int64   = psp.MaxStep - 50 // the largest step a peer may claim, less 50
	WedgeValue  float64 = 1e6
	// LiarEstimate and LiarQueryRate are an estimate-liar's report and
	// its queries per second to each peer.
	LiarEstimate  = report.LiarEstimate
	LiarQueryRate = 20
)

// hijackGenesis is the lineage lineage-hijack nodes claim in round r
// (from 0): a clock of the Unix epoch, then 2^32 − r, so that each round's
// is older than the last and every one older than any lineage a node
// makes, or the testnet's.
func hijackGenesis(r int) (g lineage.Genesis) {
	binary.BigEndian.PutUint64(g[8:], 1<<32-uint64(r))
	return g
}

// isHijack reports whether g is a lineage a lineage-hijack node claims.
func isHijack(g lineage.Genesis) bool {
	tail := binary.BigEndian.Uint64(g[8:])
	return binary.BigEndian.Uint64(g[:8]) == 0 && tail > 0 && tail <= 1<<32
}

// hijackAfter is when, into a run of d, lineage-hijack nodes begin: a
// quarter in, at least 15 s (the honest nodes have then trained together
// longer than lineage.YoungFor), at most half.
func hijackAfter(d time.Duration) time.Duration { return min(d/2, max(d/4, 15*time.Second)) }

const (
	// hijackEvery is how often a lineage-hijack node queries every peer
	// it knows; hijackRound how long it claims one lineage.
	hijackEvery = time.Second
	hijackRound = 15 * time.Second
	// wedgeEclipse is how long a joiner-wedge node's DHT names no peers
	// to a peer that just asked it for the first time.
	wedgeEclipse = 5 * time.Second
	// wedgeJoinAfter bounds how long into training the joiners through
	// joiner-wedge nodes start (a quarter of the run if shorter).
	wedgeJoinAfter = 20 * time.Second
	// impostorStreamTimeout bounds one stream an impostor serves or opens.
	impostorStreamTimeout = 10 * time.Second
)

// hostileCounts counts what the impostor roles sent and how it was
// answered, by kind: what an honest node receives from them.
type hostileCounts struct {
	hijackQueries      atomic.Uint64 // step queries sent claiming the old lineage
	hijackReplies      atomic.Uint64 // step replies sent claiming it
	hijackModels       atomic.Uint64 // models of HijackValue served
	wedgeReplies       atomic.Uint64
	wedgeModels        atomic.Uint64
	driftPushes        atomic.Uint64 // models pushed
	driftTaken         atomic.Uint64 // answered status 0
	driftDistance      atomic.Uint64 // refused for distance
	driftRate          atomic.Uint64 // refused for rate
	driftOther         atomic.Uint64 // refused otherwise, or failed
	driftModelsFetched atomic.Uint64 // victims' models fetched
	liarQueries        atomic.Uint64 // step queries answered that reported LiarEstimate
}

// impostor is what an impostor claims in its step and model answers.
type impostor struct {
	job     string
	step    int64
	genesis func() lineage.Genesis
	modelID uint32
	value   float64 // every parameter
	n       int     // parameter count
	replies *atomic.Uint64
	models  *atomic.Uint64
}

// ext is the impostor's step protocol 1.1.0 fields.
func (im *impostor) ext() wire.StepExt {
	return wire.StepExt{Genesis: im.genesis(), HasModel: true, ModelID: im.modelID, Params: uint32(im.n)}
}

// serve replaces nd's step and model handlers with the impostor's.
func (im *impostor) serve(nd *node.Node) {
	h := nd.Host()
	h.SetStreamHandler(wire.StepProtocol(im.job), im.handleStep)
	h.SetStreamHandler(wire.StepProtocolExt(im.job), im.handleStep)
	h.SetStreamHandler(wire.ModelProtocol(im.job), im.handleModel)
}

// bound gives s a deadline of impostorStreamTimeout, also on transports
// that ignore deadlines; call the result when done.
func bound(s network.Stream) func() bool {
	_ = s.SetDeadline(time.Now().Add(impostorStreamTimeout))
	return time.AfterFunc(impostorStreamTimeout, func() { _ = s.Reset() }).Stop
}

// handleStep answers every step query on s with the impostor's step and
// fields, until the asker closes the stream.
func (im *impostor) handleStep(s network.Stream) {
	defer s.Close()
	defer bound(s)()
	ext := s.Protocol() == wire.StepProtocolExt(im.job)
	r := bufio.NewReader(s)
	for {
		body, err := wire.ReadFrame(r, wire.MaxStepFrameExt)
		if err != nil {
			return
		}
		var q wire.StepRequest
		if ext {
			q, err = wire.UnmarshalStepRequestExt(body)
		} else {
			q, err = wire.UnmarshalStepRequest(body)
		}
		if err != nil || q.Leaving {
			return
		}
		rep := wire.StepReply{Step: im.step}
		var out []byte
		if ext {
			out = wire.MarshalStepReplyExt(rep, im.ext())
		} else {
			out = wire.MarshalStepReply(rep)
		}
		if wire.WriteFrame(s, out) != nil {
			return
		}
		im.replies.Add(1)
	}
}

// handleModel answers a model request with the impostor's model.
func (im *impostor) handleModel(s network.Stream) {
	defer s.Close()
	defer bound(s)()
	src := constModel{step: im.step, shape: wire.ModelShape{ID: im.modelID, N: im.n}, value: float32(im.value)}
	sv := wire.ModelServer{Life: context.Background(), Timeout: impostorStreamTimeout, Source: src, Log: slog.New(slog.DiscardHandler)}
	sv.Serve(s)
	im.models.Add(1)
}

// constModel is a model whose every value is value, at step: what an
// impostor serves.
type constModel struct {
	step  int64
	shape wire.ModelShape
	value float32
}

func (c constModel) ModelHead() (int64, wire.ModelShape, bool) { return c.step, c.shape, true }
func (c constModel) ReadModel(_ context.Context, lo, hi int, dst []float32) error {
	for i := range dst {
		dst[i] = c.value
	}
	return nil
}

// startImpostor installs the impostor of a joiner-wedge node (a
// lineage-hijack node's comes with its campaign: hijack).
func (p *Play) startImpostor(nd *node.Node) {
	task := nd.Model()
	g := plan.Genesis(p.cfg.Seed)
	im := &impostor{job: "testnet", modelID: task.ModelID(), n: task.NumParams(),
		step: WedgeStep, genesis: func() lineage.Genesis { return g }, value: WedgeValue,
		replies: &p.counts.wedgeReplies, models: &p.counts.wedgeModels}
	eclipseDHT(nd)
	im.serve(nd)
}

// eclipseDHT makes nd's DHT answer a peer with no closer peers for
// wedgeEclipse after its first request, then with the closest peers nd's
// routing table holds (see JoinerWedge).
func eclipseDHT(nd *node.Node) {
	h, rt := nd.Host(), nd.Overlay().DHT().RoutingTable()
	var mu sync.Mutex
	first := make(map[peer.ID]time.Time)
	h.SetStreamHandler(nd.Overlay().Protocol(), func(s network.Stream) {
		serveDHT(s, func(from peer.ID, key []byte) []*pb.Message_Peer {
			now := time.Now()
			mu.Lock()
			at, ok := first[from]
			if !ok {
				first[from], at = now, now
			}
			mu.Unlock()
			if now.Sub(at) < wedgeEclipse {
				return nil
			}
			var infos []peer.AddrInfo
			for _, p := range rt.NearestPeers(kbucket.ConvertKey(string(key)), 20) {
				if p != from {
					infos = append(infos, peer.AddrInfo{ID: p, Addrs: h.Peerstore().Addrs(p)})
				}
			}
			return pb.PeerInfosToPBPeers(h.Network(), infos)
		})
	})
}

// hijack is a lineage-hijack node's campaign, until ctx ends: at
// hijackAfter it stops its node's training for good (quit) and takes over its
// step and model protocols with an impostor of the round's lineage; then
// every hijackEvery it sends each peer its overlay knows a step query that
// claims that lineage and HijackStep, and every hijackRound it claims a
// new, older lineage.
func (p *Play) hijack(ctx context.Context, nd *node.Node, quit func()) {
	vclock.Sleep(ctx, hijackAfter(p.cfg.Duration))
	if ctx.Err() != nil {
		return
	}
	quit()
	task := nd.Model()
	start := time.Now()
	round := func() int { return int(time.Since(start) / hijackRound) }
	im := &impostor{job: "testnet", modelID: task.ModelID(), n: task.NumParams(),
		step: HijackStep, genesis: func() lineage.Genesis { return hijackGenesis(round()) }, value: HijackValue,
		replies: &p.counts.hijackReplies, models: &p.counts.hijackModels}
	im.serve(nd)
	h := nd.Host()
	resetStepStreams(h, "testnet") // served by the node's own handler: from now on, only the impostor answers
	proto := wire.StepProtocolExt("testnet")
	tick := time.NewTicker(hijackEvery)
	defer tick.Stop()
	for {
		body := wire.MarshalStepRequestExt(wire.StepRequest{Step: HijackStep}, im.ext())
		var wg sync.WaitGroup
		sem := make(chan struct{}, 8)
		for _, q := range nd.Overlay().Peers() {
			if _, hostile := p.net.RoleOf(q); hostile {
				continue
			}
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				if askOnce(ctx, h, q, proto, body) == nil {
					p.counts.hijackQueries.Add(1)
				}
			})
		}
		wg.Wait()
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// resetStepStreams resets every step stream of job h holds, in either
// direction.
func resetStepStreams(h host.Host, job string) {
	for _, c := range h.Network().Conns() {
		for _, s := range c.GetStreams() {
			if p := s.Protocol(); p == wire.StepProtocol(job) || p == wire.StepProtocolExt(job) {
				_ = s.Reset()
			}
		}
	}
}

// askOnce sends one step request body to p on a fresh stream and reads
// the reply.
func askOnce(ctx context.Context, h streamOpener, p peer.ID, proto protocol.ID, body []byte) error {
	sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	s, err := h.NewStream(sctx, p, proto)
	if err != nil {
		return err
	}
	defer bound(s)()
	if err := wire.WriteFrame(s, body); err != nil {
		_ = s.Reset()
		return err
	}
	if _, err := wire.ReadFrame(bufio.NewReader(s), wire.MaxStepFrameExt); err != nil {
		_ = s.Reset()
		return err
	}
	return s.Close()
}

// wedgeJoin starts, a quarter into training (at most wedgeJoinAfter), a
// fresh joiner that bootstraps through the joiner-wedge node nd alone; the
// first joiner-wedge node of several also starts one that bootstraps
// through all of them (a few identities a joiner was told of together).
func (p *Play) wedgeJoin(ctx context.Context, nd *node.Node) {
	vclock.Sleep(ctx, min(p.cfg.Duration/4, wedgeJoinAfter))
	if ctx.Err() != nil {
		return
	}
	vias := [][]*node.Node{{nd}}
	if wedges := p.net.Live(plan.JoinerWedge); len(wedges) >= 2 && wedges[0] == nd {
		vias = append(vias, wedges)
	}
	for _, via := range vias {
		if err := p.net.JoinVia(ctx, via); err != nil {
			if ctx.Err() == nil {
				p.log.Warn("join through joiner-wedge nodes failed", "through", len(via), "err", err)
			}
			return
		}
	}
}

// streamOpener opens streams: a host.
type streamOpener interface {
	NewStream(ctx context.Context, p peer.ID, pids ...protocol.ID) (network.Stream, error)
}

// impostorFigures fills h's figures of the impostor roles in the run:
// honest are the honest live nodes, probes the joiners through
// joiner-wedge nodes.
func (p *Play) impostorFigures(h *report.Hostility, honest []*node.Node, probes []Probe) {
	has := func(r plan.Role) bool { return p.cfg.HasRole(r) }
	c := &p.counts
	if has(plan.LineageHijack) {
		lf := &report.LineageFigures{QueriesSent: c.hijackQueries.Load(), RepliesSent: c.hijackReplies.Load(), ModelsServed: c.hijackModels.Load()}
		job := plan.Genesis(p.cfg.Seed)
		for _, nd := range honest {
			st := nd.Status()
			var g lineage.Genesis
			if b, err := hex.DecodeString(st.Lineage); err == nil && len(b) == len(g) {
				copy(g[:], b)
			}
			switch {
			case g == job:
				lf.OnJob++
			case isHijack(g):
				lf.Hijacked++
			default:
				lf.Other++
			}
			lf.ForksJoined += st.ForksJoined
			lf.Resets += st.Resets
			lf.ResetsRefused += st.ResetsRefused
		}
		h.Lineage = lf
	}
	if has(plan.JoinerWedge) {
		wf := &report.WedgeFigures{RepliesSent: c.wedgeReplies.Load(), ModelsServed: c.wedgeModels.Load()}
		for _, pr := range probes {
			nd := pr.Node
			st := nd.Status()
			j := report.WedgeJoiner{Step: st.Step, BarrierChecks: st.BarrierChecks, BarrierPasses: st.BarrierPasses, Live: pr.Live}
			if ev, ok := nd.Model().(node.Evaluator); ok {
				if r, err := ev.Evaluate(); err == nil {
					j.Loss = &r.Loss
				}
			}
			wf.Joiners++
			if j.Step >= WedgeStep {
				wf.Wedged++
			}
			wf.Probes = append(wf.Probes, j)
		}
		h.Wedge = wf
	}
	if has(plan.EstimateLiar) {
		h.LiarQueries = c.liarQueries.Load()
	}
	if has(plan.DriftPoison) {
		h.Drift = &report.DriftFigures{Pushes: c.driftPushes.Load(), Taken: c.driftTaken.Load(), Distance: c.driftDistance.Load(),
			Rate: c.driftRate.Load(), Other: c.driftOther.Load(), ModelsFetched: c.driftModelsFetched.Load()}
	}
}

// lie is an estimate-liar node's campaign, until ctx ends: one worker for
// each honest peer its overlay knows when training starts.
func (p *Play) lie(ctx context.Context, nd *node.Node) {
	p.eachHonestPeer(nd, func(q peer.ID) { p.lieTo(ctx, nd, q) })
}

// eachHonestPeer runs work for each honest peer nd's overlay knows now,
// each in a goroutine of its own, and returns when they have all returned.
func (p *Play) eachHonestPeer(nd *node.Node, work func(q peer.ID)) {
	var wg sync.WaitGroup
	for _, q := range nd.Overlay().Peers() {
		if _, hostile := p.net.RoleOf(q); hostile {
			continue
		}
		wg.Go(func() { work(q) })
	}
	wg.Wait()
}

// lieTo sends peer q LiarQueryRate step queries a second reporting
// LiarEstimate, on one stream as long as it lasts (as an honest asker
// reuses its streams), on a new one after a second when it fails.
func (p *Play) lieTo(ctx context.Context, nd *node.Node, q peer.ID) {
	task := nd.Model()
	ext := wire.StepExt{Genesis: plan.Genesis(p.cfg.Seed), HasModel: true, ModelID: task.ModelID(), Params: uint32(task.NumParams())}
	h := nd.Host()
	tick := time.NewTicker(time.Second / LiarQueryRate)
	defer tick.Stop()
	for ctx.Err() == nil {
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		s, err := h.NewStream(sctx, q, wire.StepProtocolExt("testnet"))
		cancel()
		if err != nil {
			vclock.Sleep(ctx, time.Second)
			continue
		}
		stop := context.AfterFunc(ctx, func() { _ = s.Reset() })
		r := bufio.NewReader(s)
		first := true
		for ctx.Err() == nil {
			q := wire.StepRequest{Step: nd.Step(), Estimate: LiarEstimate}
			e := wire.StepExt{}
			if first { // the fields go in a stream's first message (wire.StepExt)
				e, first = ext, false
			}
			_ = s.SetDeadline(time.Now().Add(2 * time.Second))
			if wire.WriteFrame(s, wire.MarshalStepRequestExt(q, e)) != nil {
				break
			}
			if _, err := wire.ReadFrame(r, wire.MaxStepFrameExt); err != nil {
				break
			}
			p.counts.liarQueries.Add(1)
			select {
			case <-ctx.Done():
			case <-tick.C:
			}
		}
		stop()
		_ = s.Reset()
		vclock.Sleep(ctx, time.Second)
	}
}
