package wire

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pspnode/pspnode/psp"
)

// The step message: "what step are you at?" and its answer (see the
// package comment for the layout). This file holds its codec, both
// versions, and how a stream carries it: the asker's reuse of streams
// (Asker) and the answerer's loop (StepServer).

// StepRequest is what a node sends when it asks a peer for its step.
type StepRequest struct {
	// Leaving marks a leave notice: the sender leaves the job, and
	// expects no reply.
	Leaving  bool
	Step     psp.Step
	Estimate float64 // the sender's population estimate; 0 if none
	// Ext is what a 1.1.0 message said of its sender beyond 1.0.0 (as
	// decoded: nil for a 1.0.0 message). Encoders do not read it.
	Ext *StepExt
}

// StepReply is a peer's answer.
type StepReply struct {
	Leaving  bool
	Step     psp.Step
	Estimate float64
	Interval float64 // seconds per step, recent mean; 0 if unknown
	// Ext is as in StepRequest: nil for a 1.0.0 reply.
	Ext *StepExt
}

// Step protocol 1.1.0: the messages of 1.0.0, each followed by fields that
// say which lineage of the job (its genesis) and which model the sender
// runs, so that two nodes learn at their first step exchange whether they
// belong together (docs/protocols.md, section 6.12).
//
//	request: the 18-byte body of a 1.0.0 request | fields
//	reply:   the 26-byte body of a 1.0.0 reply | fields
//	field:   tag u8 | length u8 | value (length bytes)
//
// Fields come in increasing order of tag, each at most once, and fill the
// body exactly. A receiver skips a field whose tag it does not know, so a
// later version can add fields without a new protocol ID; a known field of
// another length is malformed. A sender sends all its fields in its first
// message on a stream and again whenever they change, and none otherwise:
// a message without fields repeats what its sender last sent on the
// stream (nothing, if it has sent none), so a reused stream costs what a
// 1.0.0 one does (StepConn keeps what each side last sent). The fields of
// this version:
//
//	1 genesis  16 bytes  the sender's genesis; absent while it has none
//	2 model     8 bytes  model id u32 | parameter count u32, big-endian;
//	                     absent while the sender's model is not fixed (a
//	                     driven node before its first trainer)
//	3 notices   4 bytes  staleness bound u32, big-endian: the sender sends
//	                     progress notices (docs/protocols.md, 6.6), and an
//	                     asker whose step minus this bound is above the
//	                     sender's step is told when the sender reaches it;
//	                     absent from a sender that sends none
//
// A node registers both versions and asks for 1.1.0 first (multistream
// negotiation: identify has usually told it what the peer speaks), so a
// peer that knows only 1.0.0 is still asked and answered in 1.0.0.
type StepExt struct {
	// Genesis is the sender's lineage of the job (lineage.Genesis); zero
	// when it has none (it is still joining, or does not follow
	// lineages).
	Genesis [GenesisLen]byte
	// HasModel says whether the sender's model is fixed; then ModelID and
	// Params are its model id and parameter count (0 and 0 for a node
	// without a model).
	HasModel bool
	ModelID  uint32
	Params   uint32
	// Notices says whether the sender sends progress notices: a reply
	// whose step is below the request's step minus Staleness promises the
	// asker a notice (a query of the sender's) when the sender reaches
	// that threshold, within the sender's waiter lifetime. Staleness is
	// the bound of the sender's barrier (psp.Spec.BaseStaleness).
	Notices   bool
	Staleness uint32
}

const (
	kindQuery   = 1
	kindLeaving = 2

	stepRequestLen = 1 + 1 + 8 + 8
	stepReplyLen   = 1 + 1 + 8 + 8 + 8
	// MaxStepFrame caps a step message of protocol 1.0.0.
	MaxStepFrame = 64
	// MaxStepFrameExt caps a 1.1.0 step message: the 1.0.0 body and room
	// for fields this version does not know.
	MaxStepFrameExt = 255

	fieldGenesis = 1
	fieldModel   = 2
	fieldNotices = 3
	// GenesisLen is the length of a genesis (lineage.Genesis).
	GenesisLen      = 16
	modelFieldLen   = 8
	noticesFieldLen = 4
)

// stepFrameCap is the frame cap of a step stream of either version.
func stepFrameCap(ext bool) int {
	if ext {
		return MaxStepFrameExt
	}
	return MaxStepFrame
}

// MarshalStepRequest encodes a request body of step protocol 1.0.0
// (without the frame, and without q.Ext).
func MarshalStepRequest(q StepRequest) []byte { return appendStepRequest(nil, q, nil) }

// MarshalStepRequestExt encodes a request body of step protocol 1.1.0:
// the 1.0.0 body of q, then e's fields (q.Ext is not read).
func MarshalStepRequestExt(q StepRequest, e StepExt) []byte { return appendStepRequest(nil, q, &e) }

// MarshalStepReply encodes a reply body of step protocol 1.0.0 (without
// r.Ext).
func MarshalStepReply(r StepReply) []byte { return appendStepReply(nil, r, nil) }

// MarshalStepReplyExt encodes a reply body of step protocol 1.1.0: the
// 1.0.0 body of r, then e's fields (r.Ext is not read).
func MarshalStepReplyExt(r StepReply, e StepExt) []byte { return appendStepReply(nil, r, &e) }

// appendStepRequest appends the body of q to b: 1.0.0's, then e's fields
// (1.1.0) if e is not nil.
func appendStepRequest(b []byte, q StepRequest, e *StepExt) []byte {
	kind := byte(kindQuery)
	if q.Leaving {
		kind = kindLeaving
	}
	b = append(b, Version, kind)
	b = binary.BigEndian.AppendUint64(b, uint64(q.Step))
	b = binary.BigEndian.AppendUint64(b, math.Float64bits(q.Estimate))
	return appendStepExt(b, e)
}

// appendStepReply is appendStepRequest for a reply.
func appendStepReply(b []byte, r StepReply, e *StepExt) []byte {
	var flags byte
	if r.Leaving {
		flags = 1
	}
	b = append(b, Version, flags)
	b = binary.BigEndian.AppendUint64(b, uint64(r.Step))
	b = binary.BigEndian.AppendUint64(b, math.Float64bits(r.Estimate))
	b = binary.BigEndian.AppendUint64(b, math.Float64bits(r.Interval))
	return appendStepExt(b, e)
}

// appendStepExt appends e's fields to b (none for nil).
func appendStepExt(b []byte, e *StepExt) []byte {
	if e == nil {
		return b
	}
	if e.Genesis != [GenesisLen]byte{} {
		b = append(b, fieldGenesis, GenesisLen)
		b = append(b, e.Genesis[:]...)
	}
	if e.HasModel {
		b = append(b, fieldModel, modelFieldLen)
		b = binary.BigEndian.AppendUint32(b, e.ModelID)
		b = binary.BigEndian.AppendUint32(b, e.Params)
	}
	if e.Notices {
		b = append(b, fieldNotices, noticesFieldLen)
		b = binary.BigEndian.AppendUint32(b, e.Staleness)
	}
	return b
}

// UnmarshalStepRequest decodes and checks a request body of step
// protocol 1.0.0.
func UnmarshalStepRequest(b []byte) (StepRequest, error) { return parseStepRequest(b, false) }

// UnmarshalStepRequestExt decodes and checks a request body of step
// protocol 1.1.0. The request's Ext is never nil.
func UnmarshalStepRequestExt(b []byte) (StepRequest, error) { return parseStepRequest(b, true) }

// UnmarshalStepReply decodes and checks a reply body of step protocol
// 1.0.0.
func UnmarshalStepReply(b []byte) (StepReply, error) { return parseStepReply(b, false) }

// UnmarshalStepReplyExt decodes and checks a reply body of step protocol
// 1.1.0. The reply's Ext is never nil.
func UnmarshalStepReplyExt(b []byte) (StepReply, error) { return parseStepReply(b, true) }

// parseStepRequest decodes a request body of 1.1.0 (ext) or 1.0.0.
func parseStepRequest(b []byte, ext bool) (StepRequest, error) {
	if err := checkStepBody("request", b, stepRequestLen, ext); err != nil {
		return StepRequest{}, err
	}
	if b[1] != kindQuery && b[1] != kindLeaving {
		return StepRequest{}, fmt.Errorf("%w: step request kind %d", ErrMalformed, b[1])
	}
	q := StepRequest{
		Leaving:  b[1] == kindLeaving,
		Step:     psp.Step(binary.BigEndian.Uint64(b[2:])),
		Estimate: math.Float64frombits(binary.BigEndian.Uint64(b[10:])),
	}
	if err := checkStep(q.Step, q.Estimate, 0); err != nil {
		return StepRequest{}, err
	}
	var err error
	if ext {
		q.Ext, err = parseStepExt(b[stepRequestLen:])
	}
	return q, err
}

// parseStepReply decodes a reply body of 1.1.0 (ext) or 1.0.0.
func parseStepReply(b []byte, ext bool) (StepReply, error) {
	if err := checkStepBody("reply", b, stepReplyLen, ext); err != nil {
		return StepReply{}, err
	}
	if b[1]&^1 != 0 {
		return StepReply{}, fmt.Errorf("%w: step reply flags %#x", ErrMalformed, b[1])
	}
	r := StepReply{
		Leaving:  b[1]&1 != 0,
		Step:     psp.Step(binary.BigEndian.Uint64(b[2:])),
		Estimate: math.Float64frombits(binary.BigEndian.Uint64(b[10:])),
		Interval: math.Float64frombits(binary.BigEndian.Uint64(b[18:])),
	}
	if err := checkStep(r.Step, r.Estimate, r.Interval); err != nil {
		return StepReply{}, err
	}
	var err error
	if ext {
		r.Ext, err = parseStepExt(b[stepReplyLen:])
	}
	return r, err
}

// checkStepBody checks a body's length (exactly n for 1.0.0, at least n
// for 1.1.0) and version.
func checkStepBody(what string, b []byte, n int, ext bool) error {
	switch {
	case ext && len(b) < n:
		return fmt.Errorf("%w: step %s of %d bytes, want at least %d", ErrMalformed, what, len(b), n)
	case !ext && len(b) != n:
		return fmt.Errorf("%w: step %s of %d bytes, want %d", ErrMalformed, what, len(b), n)
	case b[0] != Version:
		return fmt.Errorf("%w: step %s version %d, want %d", ErrMalformed, what, b[0], Version)
	}
	return nil
}

// checkStep checks a message's step (0 to psp.MaxStep) and its estimate
// and interval (finite, not negative).
func checkStep(step psp.Step, estimate, interval float64) error {
	if step < 0 || step > psp.MaxStep {
		return fmt.Errorf("%w: step %d outside 0 to %d", ErrMalformed, step, psp.MaxStep)
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"estimate", estimate}, {"interval", interval}} {
		if math.IsNaN(f.v) || math.IsInf(f.v, 0) || f.v < 0 {
			return fmt.Errorf("%w: %s %v is not a finite non-negative number", ErrMalformed, f.name, f.v)
		}
	}
	return nil
}

// parseStepExt decodes the fields that follow a 1.1.0 body.
func parseStepExt(b []byte) (*StepExt, error) {
	var e StepExt
	last := -1
	for len(b) > 0 {
		if len(b) < 2 {
			return nil, fmt.Errorf("%w: step message field cut short", ErrMalformed)
		}
		tag, n := int(b[0]), int(b[1])
		if len(b) < 2+n {
			return nil, fmt.Errorf("%w: step message field %d of %d bytes, %d left", ErrMalformed, tag, n, len(b)-2)
		}
		if tag <= last {
			return nil, fmt.Errorf("%w: step message field %d after field %d", ErrMalformed, tag, last)
		}
		last = tag
		v := b[2 : 2+n]
		if want, ok := map[int]int{fieldGenesis: GenesisLen, fieldModel: modelFieldLen, fieldNotices: noticesFieldLen}[tag]; ok && n != want {
			return nil, fmt.Errorf("%w: step message field %d of %d bytes, want %d", ErrMalformed, tag, n, want)
		}
		switch tag {
		case fieldGenesis:
			copy(e.Genesis[:], v)
			if e.Genesis == [GenesisLen]byte{} {
				return nil, fmt.Errorf("%w: zero genesis field (a sender without one leaves it out)", ErrMalformed)
			}
		case fieldModel:
			e.HasModel, e.ModelID, e.Params = true, binary.BigEndian.Uint32(v), binary.BigEndian.Uint32(v[4:])
		case fieldNotices:
			e.Notices, e.Staleness = true, binary.BigEndian.Uint32(v)
		}
		b = b[2+n:]
	}
	return &e, nil
}

// StepConn is one step stream, of either version, with its frame reader,
// which lives as long as the stream (a reader's limit is for one frame
// per stream), its watchdog, which bounds each wait on it, and, under
// 1.1.0, the fields each side last sent on it.
type StepConn struct {
	s    network.Stream
	r    *bufio.Reader
	w    *watchdog
	used time.Time // end of its last exchange
	ext  bool      // step protocol 1.1.0, not 1.0.0
	// The 1.1.0 fields this side last sent on the stream, and those the
	// peer last sent: each side sends its fields only when they differ
	// from what it sent before on the stream.
	said, heard StepExt
	body, out   []byte // the message being sent and its frame, kept for the next
}

// NewStepConn wraps s, a stream of step protocol 1.1.0 (ext) or 1.0.0.
func NewStepConn(s network.Stream, ext bool) *StepConn {
	return &StepConn{s: s, r: bufio.NewReaderSize(s, stepFrameCap(ext)+binary.MaxVarintLen64), w: newWatchdog(s), ext: ext}
}

// errStepCut marks an exchange that went through as its deadline came or
// its context ended.
var errStepCut = errors.New("step query cut at its deadline or its end")

// ErrBadReply marks a reply that arrived but does not decode.
var ErrBadReply = errors.New("malformed step reply")

// Ask sends q on c and reads the reply (none for a leave notice), by
// deadline or until ctx ends: the stream's watchdog resets it at the
// deadline, a guard on ctx when ctx ends. (A context with the deadline,
// guarded, did the same with some seven allocations a query, and the
// stream's own deadline, set and cleared, only repeated it.) own is what
// this side's 1.1.0 messages say of it.
func (c *StepConn) Ask(ctx context.Context, q StepRequest, own StepExt, deadline time.Time) (r StepReply, err error) {
	c.w.arm(time.Until(deadline))
	stop := Guard(ctx, c.s)
	defer func() {
		// Either may have reset the stream just as the exchange went
		// through: then it fails, and the stream is not kept.
		ranOut, cut := c.w.disarm(), !stop()
		if err == nil && (ranOut || cut) {
			r, err = StepReply{}, errStepCut
		}
	}()
	var e *StepExt
	if c.ext {
		e = c.say(own)
	}
	c.body = appendStepRequest(c.body[:0], q, e)
	if err := c.send(); err != nil {
		return StepReply{}, err
	}
	if q.Leaving {
		return StepReply{}, nil
	}
	body, err := ReadFrame(c.r, stepFrameCap(c.ext))
	if err != nil {
		return StepReply{}, err
	}
	if r, err = parseStepReply(body, c.ext); err != nil {
		return StepReply{}, fmt.Errorf("%w: %w", ErrBadReply, err)
	}
	c.hear(&r.Ext)
	return r, nil
}

// send writes the body built in c.body as one frame, built in c.out
// (Write does not keep it: new buffers for every message were two
// allocations per message).
func (c *StepConn) send() error {
	c.out = AppendFrame(c.out[:0], c.body)
	_, err := c.s.Write(c.out)
	return err
}

// say returns the fields to send in this side's next message on the
// stream: own if they differ from what it last sent there, else none.
func (c *StepConn) say(own StepExt) *StepExt {
	if own == c.said {
		return &StepExt{}
	}
	c.said = own
	return &own
}

// hear completes e, a message's fields as decoded (nil under 1.0.0), with
// what the peer sent before on the stream: a message without fields
// repeats them.
func (c *StepConn) hear(e **StepExt) {
	switch {
	case *e == nil:
	case **e == (StepExt{}):
		h := c.heard
		*e = &h
	default:
		c.heard = **e
	}
}

// watchdog resets a stream when a wait armed on it runs out. It does for
// every wait on one stream what Guard does with a context of its own: one
// timer for the stream's life, re-armed for each wait, in place of a
// context, a guard and a stream deadline for each request and each reply
// (together some 10 % of the CPU of a served step query). Like Guard, it
// holds on transports whose SetDeadline does nothing (go-libp2p's
// mocknet).
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

// Step streams are reused. A step query is a few dozen bytes each way, and
// a waiting node under a sampled barrier sends ten every few tens of
// milliseconds; opening a stream for each (stream setup, protocol
// negotiation, a handler goroutine; on the in-memory transport two more
// goroutines and pipes) was about a fifth of a 200-node pBSP testnet's CPU.
// So a stream carries one exchange after another, one at a time:
//
//   - The asker keeps at most one idle stream per peer, at most Keep in
//     all, each for at most StepIdleAsker; a query takes the peer's idle
//     stream if there is one, opens a new one otherwise (also when another
//     query to that peer is in flight), and gives it back after a clean
//     exchange. Anything else (an error, a deadline, a malformed reply)
//     resets it.
//   - The answerer serves exchanges on a stream until the asker closes it,
//     it has been idle for StepIdleAnswerer, or the node is over half its
//     inbound stream cap (then it answers once and closes, so that idle
//     streams never crowd out new askers).
//   - A reused stream the answerer has closed fails at once; the query is
//     then retried once on a fresh stream, so reuse never turns a live peer
//     into a failed query.
//
// A stream that has carried one exchange and closes is exactly the old
// one-shot protocol, so askers and answerers need not agree on reuse.
const (
	StepIdleAsker    = 5 * time.Second
	StepIdleAnswerer = 2 * StepIdleAsker
)

// AskerMetrics are what an Asker counts (nil: not counted).
type AskerMetrics struct {
	Dials      prometheus.Counter // queries that had to dial (no connection to the peer)
	Stale      prometheus.Counter // queries retried because the peer had closed the idle stream
	BadReplies prometheus.Counter // replies that do not decode
	RTT        func(seconds float64)
}

// An Asker asks peers for their steps, over step streams it keeps open
// for reuse (see above). Safe for concurrent use.
type Asker struct {
	h        host.Host
	ext, old protocol.ID
	own      func() StepExt
	m        AskerMetrics

	keep   int
	mu     sync.Mutex
	idle   map[peer.ID]*StepConn
	swept  time.Time
	closed bool
}

// NewAsker asks over h, in job's step protocol, keeping up to keep idle
// streams (0: a stream per query). own is what this side's 1.1.0
// messages say of it, read at each query.
func NewAsker(h host.Host, job string, keep int, own func() StepExt, m AskerMetrics) *Asker {
	return &Asker{h: h, ext: StepProtocolExt(job), old: StepProtocol(job), own: own, m: m, keep: keep, idle: make(map[peer.ID]*StepConn)}
}

// Ask asks p for its step, on its idle stream if it has one, within
// timeout or until ctx ends. A leave notice (q.Leaving) goes on a fresh
// stream, which it closes: a stale one could swallow it.
func (a *Asker) Ask(ctx context.Context, p peer.ID, q StepRequest, timeout time.Duration) (StepReply, error) {
	start := time.Now()
	deadline := start.Add(timeout)
	fresh := q.Leaving
	for {
		var c *StepConn
		if !fresh {
			c = a.take(p, start)
		}
		reused := c != nil
		if !reused {
			if a.h.Network().Connectedness(p) != network.Connected {
				inc(a.m.Dials)
			}
			// 1.1.0 if the peer speaks it (identify has usually said),
			// else 1.0.0.
			sctx, cancel := context.WithDeadline(ctx, deadline)
			s, err := a.h.NewStream(network.WithAllowLimitedConn(sctx, "step"), p, a.ext, a.old)
			cancel()
			if err != nil {
				return StepReply{}, err
			}
			c = NewStepConn(s, s.Protocol() == a.ext)
		}
		r, err := c.Ask(ctx, q, a.own(), deadline)
		switch {
		case err == nil && q.Leaving:
			_ = c.s.Close()
			return r, nil
		case err == nil:
			if a.m.RTT != nil {
				a.m.RTT(time.Since(start).Seconds())
			}
			a.put(p, c, time.Now())
			return r, nil
		}
		_ = c.s.Reset()
		if errors.Is(err, ErrBadReply) {
			inc(a.m.BadReplies)
			return StepReply{}, err
		}
		if !reused || ctx.Err() != nil || !time.Now().Before(deadline) {
			return StepReply{}, err
		}
		inc(a.m.Stale) // the answerer closed it: once more, on a fresh stream
		fresh = true
	}
}

// The methods below close and reset streams only after releasing mu: a
// Close or Reset writes a frame and can block on a congested connection,
// and under the lock one such peer stalled every query of the node.

// take removes and returns p's idle stream, or nil.
func (a *Asker) take(p peer.ID, now time.Time) *StepConn {
	a.mu.Lock()
	c := a.idle[p]
	if c != nil {
		delete(a.idle, p)
	}
	a.mu.Unlock()
	if c != nil && now.Sub(c.used) > StepIdleAsker {
		_ = c.s.Close()
		return nil
	}
	return c
}

// put keeps c as p's idle stream, or closes it if the set is full, p
// already has one, or the asker is closed. Now and then it closes the
// idle streams that have expired.
func (a *Asker) put(p peer.ID, c *StepConn, now time.Time) {
	c.used = now
	var expired []*StepConn
	a.mu.Lock()
	if now.Sub(a.swept) > StepIdleAsker {
		a.swept = now
		for q, old := range a.idle {
			if now.Sub(old.used) > StepIdleAsker {
				expired = append(expired, old)
				delete(a.idle, q)
			}
		}
	}
	kept := !a.closed && a.idle[p] == nil && len(a.idle) < a.keep
	if kept {
		a.idle[p] = c
	}
	a.mu.Unlock()
	if !kept {
		_ = c.s.Close()
	}
	for _, old := range expired {
		_ = old.s.Close()
	}
}

// Drop resets p's idle stream, if any (p left or failed).
func (a *Asker) Drop(p peer.ID) {
	a.mu.Lock()
	c := a.idle[p]
	delete(a.idle, p)
	a.mu.Unlock()
	if c != nil {
		_ = c.s.Reset()
	}
}

// Close resets every idle stream and keeps no more.
func (a *Asker) Close() {
	a.mu.Lock()
	a.closed = true
	idle := a.idle
	a.idle = make(map[peer.ID]*StepConn)
	a.mu.Unlock()
	for _, c := range idle {
		_ = c.s.Reset()
	}
}

// inc adds one to c, if it is not nil.
func inc(c prometheus.Counter) {
	if c != nil {
		c.Inc()
	}
}
