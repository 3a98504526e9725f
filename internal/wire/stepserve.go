package wire

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"
)

// The answering side of the step message (step.go): a loop per stream.

// A StepHandler is what a StepServer answers with: the node.
type StepHandler interface {
	// Leaving takes a leave notice from a peer.
	Leaving(from peer.ID)
	// Answer is the reply to q, from a peer. more says whether the
	// stream may carry another exchange (false: one answer is all it
	// needs); drop says to send nothing and reset the stream.
	Answer(from peer.ID, q StepRequest) (r StepReply, more, drop bool)
}

// A StepServer answers step queries, on streams of either version.
type StepServer struct {
	// Life ends when the node closes: it cuts every stream.
	Life context.Context
	// QueryTimeout bounds the wait for a stream's first request and for
	// an answer; a later request may take StepIdleAnswerer.
	QueryTimeout time.Duration
	Handler      StepHandler
	Inbound      *Inbound
	// Own is what this side's 1.1.0 replies say of it.
	Own       func() StepExt
	Malformed prometheus.Counter
	Log       *slog.Logger
}

// Serve answers step queries on s, of version 1.1.0 (ext) or 1.0.0, until
// the asker closes it, it idles, or the node is over half its inbound cap
// (see above). sl is the stream's slot under the inbound caps: idle while
// the stream waits for a request, when a new stream may take it.
func (sv *StepServer) Serve(s network.Stream, ext bool, sl *Slot) {
	defer s.Close()
	defer Guard(sv.Life, s)() // the node's closing cuts the stream
	c := NewStepConn(s, ext)
	from := s.Conn().RemotePeer()
	for first := true; sv.serveOne(c, from, first, sl) && sv.Inbound.roomy(); first = false {
	}
}

// serveOne reads one request (the first of a stream within the query
// timeout, a later one within StepIdleAnswerer) and answers it within the
// query timeout; it reports whether the stream may carry another.
func (sv *StepServer) serveOne(c *StepConn, from peer.ID, first bool, sl *Slot) bool {
	wait := sv.QueryTimeout
	if !first {
		wait = StepIdleAnswerer
	}
	// The wait for a request is the stream's read deadline, not the
	// watchdog: a node's served streams wait idle most of the time, one
	// per peer that asks it, and a deadline costs a timer only while a
	// read blocks (in the in-memory network, not even that: it keeps
	// one timer for all). On a transport that ignores deadlines an idle
	// stream waits until its asker or its connection closes it.
	_ = c.s.SetReadDeadline(time.Now().Add(wait))
	body, err := ReadFrame(c.r, stepFrameCap(c.ext))
	sv.Inbound.busy(sl, true) // a request (or the stream's end) came: not idle
	defer sv.Inbound.busy(sl, false)
	idled := IsTimeout(err)
	if idled {
		_ = c.s.Reset()
	}
	var q StepRequest
	if err == nil {
		q, err = parseStepRequest(body, c.ext)
	}
	if err != nil {
		// A reused stream that ends before its next request (the asker
		// closed it, or it idled) ends normally; a stream whose first
		// request does not come in time is malformed, as before reuse.
		if !first && (idled || errors.Is(err, io.EOF)) || sv.Life.Err() != nil {
			return false // closed by the deferred Close (a no-op after a reset)
		}
		inc(sv.Malformed)
		sv.Log.Debug("malformed step request", "from", from, "err", err)
		_ = c.s.Reset()
		return false
	}
	c.hear(&q.Ext)
	if q.Leaving {
		sv.Handler.Leaving(from)
		return false
	}
	c.w.arm(sv.QueryTimeout)
	r, more, drop := sv.Handler.Answer(from, q)
	if drop {
		c.w.disarm()
		_ = c.s.Reset()
		return false
	}
	var e *StepExt
	if c.ext {
		e = c.say(sv.Own())
	}
	c.body = appendStepReply(c.body[:0], r, e)
	err = c.send()
	late := c.w.disarm()
	if err != nil {
		_ = c.s.Reset()
		return false
	}
	return more && !late && sv.Life.Err() == nil && !r.Leaving
}
