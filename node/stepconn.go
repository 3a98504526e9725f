package node

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/internal/wire"
)

// Step streams are reused. A step query is a few dozen bytes each way, and
// a waiting node under a sampled barrier sends ten every few tens of
// milliseconds; opening a stream for each (stream setup, protocol
// negotiation, a handler goroutine; on the in-memory transport two more
// goroutines and pipes) was about a fifth of a 200-node pBSP testnet's CPU.
// So a stream carries one exchange after another, one at a time:
//
//   - The asker keeps at most one idle stream per peer, at most
//     Config.StepStreams in all, each for at most stepIdleAsker; a query
//     takes the peer's idle stream if there is one, opens a new one
//     otherwise (also when another query to that peer is in flight), and
//     gives it back after a clean exchange. Anything else (an error, a
//     deadline, a malformed reply) resets it.
//   - The answerer serves exchanges on a stream until the asker closes it,
//     it has been idle for stepIdleAnswerer, or the node is over half its
//     inbound stream cap (then it answers once and closes, so that idle
//     streams never crowd out new askers).
//   - A reused stream the answerer has closed fails at once; the query is
//     then retried once on a fresh stream, so reuse never turns a live peer
//     into a failed query.
//
// A stream that has carried one exchange and closes is exactly the old
// one-shot protocol, so askers and answerers need not agree on reuse.
const (
	stepIdleAsker    = 5 * time.Second
	stepIdleAnswerer = 2 * stepIdleAsker
)

// stepStream is an open step stream with its frame reader, which lives as
// long as the stream (smallReader's limit is for one frame per stream), and
// its watchdog, which bounds each wait on it.
type stepStream struct {
	s    network.Stream
	r    *bufio.Reader
	w    *watchdog
	used time.Time // end of its last exchange
	ext  bool      // step protocol 1.1.0 (internal/wire/stepext.go), not 1.0.0
	// The 1.1.0 fields this side last sent on the stream, and those the
	// peer last sent: each side sends its fields only when they differ
	// from what it sent before on the stream (internal/wire/stepext.go).
	said, heard wire.StepExt
	out         []byte // the frame being sent, kept for the next
}

// send writes body as one frame, built in st.out (Write does not keep it:
// a new buffer for every frame was two allocations per message).
func (st *stepStream) send(body []byte) error {
	st.out = appendFrame(st.out[:0], body)
	_, err := st.s.Write(st.out)
	return err
}

func newStepStream(s network.Stream, ext bool) *stepStream {
	return &stepStream{s: s, r: bufio.NewReaderSize(s, stepFrameCap(ext)+binary.MaxVarintLen64), w: newWatchdog(s), ext: ext}
}

// say returns the fields to send in this side's next message on the
// stream: own if they differ from what it last sent there, else none.
func (st *stepStream) say(own wire.StepExt) wire.StepExt {
	if own == st.said {
		return wire.StepExt{}
	}
	st.said = own
	return own
}

// hear completes e, a message's fields as decoded, with what the peer
// sent before on the stream: a message without fields repeats them.
func (st *stepStream) hear(e *wire.StepExt) {
	if *e == (wire.StepExt{}) {
		*e = st.heard
	} else {
		st.heard = *e
	}
}

// stepFrameCap is the frame cap of a step stream of either version.
func stepFrameCap(ext bool) int {
	if ext {
		return wire.MaxStepFrameExt
	}
	return wire.MaxStepFrame
}

// stepStreams holds the asker's idle streams.
type stepStreams struct {
	max int

	mu     sync.Mutex
	idle   map[peer.ID]*stepStream
	swept  time.Time
	closed bool
}

func newStepStreams(max int) *stepStreams {
	return &stepStreams{max: max, idle: make(map[peer.ID]*stepStream)}
}

// The methods below close and reset streams only after releasing mu: a
// Close or Reset writes a frame and can block on a congested connection,
// and under the lock one such peer stalled every query of the node.

// take removes and returns p's idle stream, or nil.
func (ss *stepStreams) take(p peer.ID, now time.Time) *stepStream {
	ss.mu.Lock()
	st := ss.idle[p]
	if st != nil {
		delete(ss.idle, p)
	}
	ss.mu.Unlock()
	if st != nil && now.Sub(st.used) > stepIdleAsker {
		_ = st.s.Close()
		return nil
	}
	return st
}

// put keeps st as p's idle stream, or closes it if the set is full, p
// already has one, or the node is closing. Now and then it closes the idle
// streams that have expired.
func (ss *stepStreams) put(p peer.ID, st *stepStream, now time.Time) {
	st.used = now
	var expired []*stepStream
	ss.mu.Lock()
	if now.Sub(ss.swept) > stepIdleAsker {
		ss.swept = now
		for q, old := range ss.idle {
			if now.Sub(old.used) > stepIdleAsker {
				expired = append(expired, old)
				delete(ss.idle, q)
			}
		}
	}
	kept := !ss.closed && ss.idle[p] == nil && len(ss.idle) < ss.max
	if kept {
		ss.idle[p] = st
	}
	ss.mu.Unlock()
	if !kept {
		_ = st.s.Close()
	}
	for _, old := range expired {
		_ = old.s.Close()
	}
}

// drop resets p's idle stream, if any (p left or failed).
func (ss *stepStreams) drop(p peer.ID) {
	ss.mu.Lock()
	st := ss.idle[p]
	delete(ss.idle, p)
	ss.mu.Unlock()
	if st != nil {
		_ = st.s.Reset()
	}
}

// close resets every idle stream and refuses new ones.
func (ss *stepStreams) close() {
	ss.mu.Lock()
	ss.closed = true
	idle := ss.idle
	ss.idle = make(map[peer.ID]*stepStream)
	ss.mu.Unlock()
	for _, st := range idle {
		_ = st.s.Reset()
	}
}

// queryStep asks one peer for its step, on its idle step stream if it has
// one (see stepStreams), within the query timeout of the node's timing now.
func (n *Node) queryStep(ctx context.Context, p peer.ID, req wire.StepRequest) (wire.StepReply, error) {
	return n.queryStepWithin(ctx, p, req, n.timing().timeout)
}

// queryStepWithin is queryStep within timeout (a barrier's, set at its
// start), or until ctx ends.
func (n *Node) queryStepWithin(ctx context.Context, p peer.ID, req wire.StepRequest, timeout time.Duration) (wire.StepReply, error) {
	start := time.Now()
	deadline := start.Add(timeout)
	// A leave notice goes on a fresh stream: a stale one could swallow it.
	fresh := req.Leaving
	for {
		var st *stepStream
		if !fresh {
			st = n.steps.take(p, start)
		}
		reused := st != nil
		if !reused {
			if n.h.Network().Connectedness(p) != network.Connected {
				n.m.stepDials.Inc()
			}
			// 1.1.0 if the peer speaks it (identify has usually said),
			// else 1.0.0.
			s, err := n.newStepStream(ctx, p, deadline)
			if err != nil {
				return wire.StepReply{}, err
			}
			st = newStepStream(s, s.Protocol() == n.stepExtID)
		}
		r, err := n.exchange(ctx, st, req, deadline)
		if err == nil {
			if req.Leaving {
				_ = st.s.Close()
				return r, nil
			}
			n.m.observeRTT(time.Since(start).Seconds())
			n.steps.put(p, st, time.Now())
			return r, nil
		}
		_ = st.s.Reset()
		if errors.Is(err, errBadReply) {
			n.m.queryErrors.Inc()
			return wire.StepReply{}, err
		}
		if !reused || ctx.Err() != nil || !time.Now().Before(deadline) {
			return wire.StepReply{}, err
		}
		n.m.staleStreams.Inc() // the answerer closed it: once more, on a fresh stream
		fresh = true
	}
}

// newStepStream opens a step stream to p by deadline.
func (n *Node) newStepStream(ctx context.Context, p peer.ID, deadline time.Time) (network.Stream, error) {
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	return n.h.NewStream(network.WithAllowLimitedConn(ctx, "step"), p, n.stepExtID, n.stepID)
}

// errBadReply marks a reply that arrived but does not decode; errStepCut
// an exchange that went through as its deadline came or its context ended.
var (
	errBadReply = errors.New("malformed step reply")
	errStepCut  = errors.New("step query cut at its deadline or its end")
)

// exchange sends one request on st and reads its reply (none for a leave
// notice), by deadline or until ctx ends: the stream's watchdog resets it
// at the deadline, a guard on ctx when ctx ends. (A context with the
// deadline, guarded, did the same with some seven allocations a query,
// and the stream's own deadline, set and cleared, only repeated it.)
func (n *Node) exchange(ctx context.Context, st *stepStream, req wire.StepRequest, deadline time.Time) (r wire.StepReply, err error) {
	st.w.arm(time.Until(deadline))
	stop := guard(ctx, st.s)
	defer func() {
		// Either may have reset the stream just as the exchange went
		// through: then it fails, and the stream is not kept.
		ranOut, cut := st.w.disarm(), !stop()
		if err == nil && (ranOut || cut) {
			r, err = wire.StepReply{}, errStepCut
		}
	}()
	var body []byte
	if st.ext {
		body = wire.MarshalStepRequestExt(req, st.say(n.ownExt()))
	} else {
		body = wire.MarshalStepRequest(req)
	}
	if err := st.send(body); err != nil {
		return wire.StepReply{}, err
	}
	if req.Leaving {
		return wire.StepReply{}, nil
	}
	body, err = readFrame(st.r, stepFrameCap(st.ext))
	if err != nil {
		return wire.StepReply{}, err
	}
	if st.ext {
		if r, err = wire.UnmarshalStepReplyExt(body); err == nil {
			st.hear(r.Ext)
		}
	} else {
		r, err = wire.UnmarshalStepReply(body)
	}
	if err != nil {
		return wire.StepReply{}, fmt.Errorf("%w: %w", errBadReply, err)
	}
	return r, nil
}

// handleStep answers step queries on one stream until the asker closes it,
// it idles, or the node is over half its inbound cap (see stepStreams).
// sl is the stream's slot under the step limiter: idle while the stream
// waits for a request, when a new stream may take it (limits.go).
func (n *Node) handleStep(s network.Stream, sl *stepSlot) {
	from := s.Conn().RemotePeer()
	defer s.Close()
	defer guard(n.life, s)() // the node's closing cuts the stream
	st := newStepStream(s, s.Protocol() == n.stepExtID)
	first := true
	for n.serveStep(s, st, from, first, sl) && n.limiter.roomy() {
		first = false
	}
}

// isTimeout reports whether err is a stream's deadline passing.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// watchdog resets a stream when a wait armed on it runs out. It does for
// every wait on one stream what guard does with a context of its own:
// one timer for the stream's life, re-armed for each wait, in place of a
// context, a guard and a stream deadline for each request and each reply
// (together some 10 % of the CPU of a served step query). Like guard, it
// holds on transports whose SetDeadline does nothing (go-libp2p's mocknet).
type watchdog struct{ t *time.Timer }

func newWatchdog(s network.Stream) *watchdog {
	t := time.AfterFunc(time.Hour, func() { _ = s.Reset() })
	t.Stop()
	return &watchdog{t}
}

// arm starts a wait of d; every arm is followed by one disarm.
func (w *watchdog) arm(d time.Duration) { w.t.Reset(d) }

// disarm ends the wait and reports whether it ran out (the stream is then
// reset, or being reset).
func (w *watchdog) disarm() (ranOut bool) { return !w.t.Stop() }

// serveStep reads one request (the first of a stream within the query
// timeout, a later one within stepIdleAnswerer) and answers it within the
// query timeout; it reports whether the stream may carry another.
func (n *Node) serveStep(s network.Stream, st *stepStream, from peer.ID, first bool, sl *stepSlot) bool {
	w := st.w
	wait := n.cfg.QueryTimeout
	if !first {
		wait = stepIdleAnswerer
	}
	// The wait for a request is the stream's read deadline, not the
	// watchdog: a node's served streams wait idle most of the time, one
	// per peer that asks it, and a deadline costs a timer only while a
	// read blocks (in the in-memory network, not even that: it keeps
	// one timer for all). On a transport that ignores deadlines an idle
	// stream waits until its asker or its connection closes it.
	_ = s.SetReadDeadline(time.Now().Add(wait))
	body, err := readFrame(st.r, stepFrameCap(st.ext))
	n.limiter.busy(sl, true) // a request (or the stream's end) came: not idle
	defer n.limiter.busy(sl, false)
	idled := isTimeout(err)
	if idled {
		_ = s.Reset()
	}
	var q wire.StepRequest
	switch {
	case err != nil:
	case st.ext:
		if q, err = wire.UnmarshalStepRequestExt(body); err == nil {
			st.hear(q.Ext)
		}
	default:
		q, err = wire.UnmarshalStepRequest(body)
	}
	if err != nil {
		// A reused stream that ends before its next request (the asker
		// closed it, or it idled) ends normally; a stream whose first
		// request does not come in time is malformed, as before reuse.
		if !first && (idled || errors.Is(err, io.EOF)) {
			return false // closed by the deferred Close (a no-op after a reset)
		}
		if n.life.Err() != nil {
			return false // this node is closing: the stream was cut here
		}
		n.m.malformed.Inc()
		n.log.Debug("malformed step request", "from", from, "err", err)
		_ = s.Reset()
		return false
	}
	if q.Leaving {
		n.noteLeft(from)
		n.dropPeer(from)
		n.poke()
		return false
	}
	w.arm(n.cfg.QueryTimeout)
	// A peer of another model is held out (it learns why from the reply);
	// one of another lineage is alive, but its step is not this node's
	// job's (genesis.go).
	k := n.admit(from, q.Ext, false)
	if k != otherModel {
		n.noteHeard(from) // it reached us: the node is not cut off (isolation.go)
		n.ov.MarkAlive(from)
	}
	if q.Estimate > 0 && k == kin {
		n.ov.ObserveEstimate(from, q.Estimate)
		n.notePeerEstimate(q.Estimate)
	}
	if k == kin {
		// Before the reply's step is read: a reply below the asker's
		// threshold promises it a progress notice (the notices field),
		// so the asker must be a waiter before this node can advance
		// past the step it replies with (progress.go).
		n.noteAsker(from, q.Step)
	}
	reply := wire.StepReply{Leaving: n.leaving.Load() || n.idle.Load(), Step: n.step.Load(), Estimate: n.estimate(), Interval: n.stepInterval()}
	if f := n.cfg.faults; f.Misbehaves() {
		ctx, cancel := context.WithTimeout(n.life, n.cfg.QueryTimeout)
		defer cancel()
		if n.lost() {
			<-ctx.Done() // the query is lost: the asker hears nothing
			w.disarm()
			_ = s.Reset()
			return false
		}
		if f.ReplyDelay > 0 {
			sleepCtx(ctx, f.ReplyDelay)
		}
		if f.StepLie != nil {
			reply.Step = f.StepLie(reply.Step)
		}
	}
	var out []byte
	if st.ext {
		out = wire.MarshalStepReplyExt(reply, st.say(n.ownExt()))
	} else {
		out = wire.MarshalStepReply(reply)
	}
	err = st.send(out)
	late := w.disarm()
	if err != nil {
		_ = s.Reset()
		return false
	}
	switch k {
	case otherModel:
		return false // one answer is all it needs to tell
	case kin:
		if q.Step <= n.step.Load() {
			n.poke() // a peer at or behind us has progressed
		}
	}
	return !late && n.life.Err() == nil && !reply.Leaving
}
