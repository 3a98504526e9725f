package wire

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"log/slog"
	"math"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/pspnode/pspnode/internal/memnet"
	"github.com/pspnode/pspnode/internal/vclock"
	"github.com/pspnode/pspnode/psp"
)

func TestStepCodecRoundTrip(t *testing.T) {
	for _, q := range []StepRequest{{}, {Step: 42, Estimate: 199.5}, {Leaving: true, Step: psp.MaxStep}} {
		got, err := UnmarshalStepRequest(MarshalStepRequest(q))
		if err != nil || got != q {
			t.Errorf("request %+v: got %+v, %v", q, got, err)
		}
	}
	for _, r := range []StepReply{{}, {Step: 7, Estimate: 3, Interval: 1.25}, {Leaving: true}} {
		got, err := UnmarshalStepReply(MarshalStepReply(r))
		if err != nil || got != r {
			t.Errorf("reply %+v: got %+v, %v", r, got, err)
		}
	}
}

func TestStepCodecRejects(t *testing.T) {
	good := MarshalStepRequest(StepRequest{Step: 3, Estimate: 10})
	mut := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	for name, b := range map[string][]byte{
		"empty":    {},
		"short":    good[:5],
		"long":     append(append([]byte(nil), good...), 0),
		"version":  mut(func(b []byte) []byte { b[0] = 9; return b }),
		"kind":     mut(func(b []byte) []byte { b[1] = 7; return b }),
		"negative": mut(func(b []byte) []byte { b[2] = 0x80; return b }),
		"nan":      MarshalStepRequest(StepRequest{Estimate: math.NaN()}),
		"inf":      MarshalStepRequest(StepRequest{Estimate: math.Inf(1)}),
		"too far":  MarshalStepRequest(StepRequest{Step: psp.MaxStep + 1}),
	} {
		if _, err := UnmarshalStepRequest(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: want ErrMalformed, got %v", name, err)
		}
	}
	for name, b := range map[string][]byte{
		"flags":    func() []byte { b := MarshalStepReply(StepReply{}); b[1] = 2; return b }(),
		"interval": MarshalStepReply(StepReply{Interval: math.NaN()}),
		"negative": MarshalStepReply(StepReply{Step: -1}),
		"too far":  MarshalStepReply(StepReply{Step: psp.MaxStep + 1}),
		"short":    MarshalStepReply(StepReply{})[:10],
	} {
		if _, err := UnmarshalStepReply(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("reply %s: want ErrMalformed, got %v", name, err)
		}
	}
}

func FuzzStepMessages(f *testing.F) {
	f.Add(MarshalStepRequest(StepRequest{Step: 5, Estimate: 10}))
	f.Add(MarshalStepReply(StepReply{Step: 5, Estimate: 10, Interval: 1}))
	f.Add([]byte{})
	f.Add([]byte{1, 2, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		if q, err := UnmarshalStepRequest(b); err == nil {
			if q.Step < 0 || q.Step > psp.MaxStep || !(q.Estimate >= 0) || math.IsInf(q.Estimate, 0) {
				t.Fatalf("accepted a bad request %+v", q)
			}
			if again, err := UnmarshalStepRequest(MarshalStepRequest(q)); err != nil || again != q {
				t.Fatalf("re-encoding changed %+v", q)
			}
		}
		if r, err := UnmarshalStepReply(b); err == nil {
			if r.Step < 0 || !(r.Interval >= 0) || math.IsInf(r.Interval, 0) {
				t.Fatalf("accepted a bad reply %+v", r)
			}
		}
	})
}

// exampleGenesis is the genesis of docs/protocols.md's examples (6.12):
// 2025-01-01T00:00:00Z, then the bytes 01 to 08.
var exampleGenesis = func() [GenesisLen]byte {
	var g [GenesisLen]byte
	b, _ := hex.DecodeString("1816687ec05700000102030405060708")
	copy(g[:], b)
	return g
}()

// The worked examples of docs/protocols.md, section 6.12, byte for byte.
func TestStepExtExamples(t *testing.T) {
	linreg := &StepExt{Genesis: exampleGenesis, HasModel: true, ModelID: 0x1f8601fc, Params: 21}
	frame := func(body []byte) string {
		return hex.EncodeToString(append(binary.AppendUvarint(nil, uint64(len(body))), body...))
	}
	for _, tc := range []struct {
		name, want string
		got        []byte
	}{
		{"query", "2e0101000000000000002a4068f00000000000" + "01101816687ec05700000102030405060708" + "02081f8601fc00000015",
			MarshalStepRequestExt(StepRequest{Step: 42, Estimate: 199.5}, *linreg)},
		{"reply", "360100000000000000002840690000000000003ff4000000000000" + "01101816687ec05700000102030405060708" + "02081f8601fc00000015",
			MarshalStepReplyExt(StepReply{Step: 40, Estimate: 200, Interval: 1.25}, *linreg)},
		{"reply with notices", "3c0100000000000000002840690000000000003ff400000000000001101816687ec0570000010203040506070802081f8601fc00000015030400000004",
			MarshalStepReplyExt(StepReply{Step: 40, Estimate: 200, Interval: 1.25}, StepExt{Genesis: exampleGenesis, HasModel: true, ModelID: 0x1f8601fc, Params: 21, Notices: true, Staleness: 4})},
		{"no fields", "1a0100000000000000002840690000000000003ff4000000000000",
			MarshalStepReplyExt(StepReply{Step: 40, Estimate: 200, Interval: 1.25}, StepExt{})},
		{"no model yet", "2c0100000000000000002840690000000000003ff4000000000000" + "01101816687ec05700000102030405060708",
			MarshalStepReplyExt(StepReply{Step: 40, Estimate: 200, Interval: 1.25}, StepExt{Genesis: exampleGenesis})},
		{"no model at all", "2401000000000000000028000000000000000000000000000000000208" + "0000000000000000",
			MarshalStepReplyExt(StepReply{Step: 40}, StepExt{HasModel: true})},
	} {
		if got := frame(tc.got); got != tc.want {
			t.Errorf("%s:\n got %s\nwant %s", tc.name, got, tc.want)
		}
	}
	// An unknown field (tag 9, 3 bytes) between and after the known ones
	// is skipped.
	b, _ := hex.DecodeString("0101000000000000002a4068f00000000000" + "01101816687ec05700000102030405060708" + "02081f8601fc00000015" + "0903aabbcc")
	q, err := UnmarshalStepRequestExt(b)
	if err != nil || q.Step != 42 || q.Ext == nil || *q.Ext != *linreg {
		t.Errorf("a request with an unknown field: %+v %v, %v", q, q.Ext, err)
	}
}

func TestStepExtRoundTrip(t *testing.T) {
	for _, e := range []StepExt{{}, {Genesis: exampleGenesis}, {HasModel: true}, {Notices: true}, {Genesis: [GenesisLen]byte{0x18, 15: 9}, HasModel: true, ModelID: 7, Params: math.MaxUint32, Notices: true, Staleness: 4}} {
		q := StepRequest{Leaving: true, Step: 9, Estimate: 3}
		got, err := UnmarshalStepRequestExt(MarshalStepRequestExt(q, e))
		if err != nil || got.Ext == nil || *got.Ext != e || got.Step != 9 || !got.Leaving || got.Estimate != 3 {
			t.Errorf("request %+v: got %+v (%+v), %v", e, got, got.Ext, err)
		}
		r := StepReply{Step: 9, Estimate: 3, Interval: 0.5}
		gr, err := UnmarshalStepReplyExt(MarshalStepReplyExt(r, e))
		if err != nil || gr.Ext == nil || *gr.Ext != e || gr.Step != 9 || gr.Interval != 0.5 {
			t.Errorf("reply %+v: got %+v (%+v), %v", e, gr, gr.Ext, err)
		}
	}
	// No fields read back as an empty Ext, never a nil one.
	got, err := UnmarshalStepRequestExt(MarshalStepRequestExt(StepRequest{Step: 1}, StepExt{}))
	if err != nil || got.Ext == nil || *got.Ext != (StepExt{}) {
		t.Errorf("no fields: %+v, %v", got, err)
	}
}

func TestStepExtRejects(t *testing.T) {
	req := MarshalStepRequest(StepRequest{Step: 3})
	rep := MarshalStepReply(StepReply{Step: 3})
	gen := append([]byte{fieldGenesis, GenesisLen}, exampleGenesis[:]...)
	model := []byte{fieldModel, modelFieldLen, 0, 0, 0, 1, 0, 0, 0, 2}
	cat := func(bs ...[]byte) []byte { return bytes.Join(bs, nil) }
	for name, fields := range map[string][]byte{
		"cut tag":          {fieldGenesis},
		"cut value":        gen[:10],
		"genesis length":   cat([]byte{fieldGenesis, 15}, exampleGenesis[:15]),
		"zero genesis":     cat([]byte{fieldGenesis, GenesisLen}, make([]byte, GenesisLen)),
		"model length":     {fieldModel, 4, 0, 0, 0, 1},
		"notices length":   {fieldNotices, 1, 0},
		"notices first":    cat([]byte{fieldNotices, noticesFieldLen, 0, 0, 0, 0}, gen),
		"out of order":     cat(model, gen),
		"twice":            cat(gen, gen),
		"unknown, cut":     {9, 5, 1, 2},
		"unknown, reorder": cat(model, []byte{1, 0}),
	} {
		if _, err := UnmarshalStepRequestExt(cat(req, fields)); !errors.Is(err, ErrMalformed) {
			t.Errorf("request, %s: want ErrMalformed, got %v", name, err)
		}
		if _, err := UnmarshalStepReplyExt(cat(rep, fields)); !errors.Is(err, ErrMalformed) {
			t.Errorf("reply, %s: want ErrMalformed, got %v", name, err)
		}
	}
	// The 1.0.0 body's own checks still hold, and a body shorter than it
	// is malformed.
	bad := append([]byte(nil), rep...)
	bad[1] = 2 // a flag bit 1.0.0 does not define
	for name, b := range map[string][]byte{"short request": req[:17], "short reply": rep[:25], "flags": bad} {
		_, errQ := UnmarshalStepRequestExt(b)
		_, errR := UnmarshalStepReplyExt(b)
		if !errors.Is(errQ, ErrMalformed) || !errors.Is(errR, ErrMalformed) {
			t.Errorf("%s: %v, %v", name, errQ, errR)
		}
	}
}

func FuzzStepExtMessages(f *testing.F) {
	e := &StepExt{Genesis: exampleGenesis, HasModel: true, ModelID: 0x1f8601fc, Params: 21}
	f.Add(MarshalStepRequestExt(StepRequest{Step: 5, Estimate: 10}, *e))
	f.Add(MarshalStepReplyExt(StepReply{Step: 5, Estimate: 10, Interval: 1}, *e))
	f.Add(append(MarshalStepReply(StepReply{}), 9, 2, 0, 0, 1, 16))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		if q, err := UnmarshalStepRequestExt(b); err == nil {
			if q.Ext == nil || q.Step < 0 || !(q.Estimate >= 0) || math.IsInf(q.Estimate, 0) {
				t.Fatalf("accepted a bad request %+v", q)
			}
			again, err := UnmarshalStepRequestExt(MarshalStepRequestExt(q, *q.Ext))
			if err != nil || again.Ext == nil || *again.Ext != *q.Ext || again.Step != q.Step || again.Leaving != q.Leaving {
				t.Fatalf("re-encoding changed %+v (%+v): %+v, %v", q, q.Ext, again, err)
			}
		}
		if r, err := UnmarshalStepReplyExt(b); err == nil {
			if r.Ext == nil || r.Step < 0 || !(r.Interval >= 0) || math.IsInf(r.Interval, 0) {
				t.Fatalf("accepted a bad reply %+v", r)
			}
			again, err := UnmarshalStepReplyExt(MarshalStepReplyExt(r, *r.Ext))
			if err != nil || again.Ext == nil || *again.Ext != *r.Ext || again.Step != r.Step || again.Leaving != r.Leaving {
				t.Fatalf("re-encoding changed %+v (%+v): %+v, %v", r, r.Ext, again, err)
			}
		}
	})
}

// stepPair is two hosts on an in-memory network, a asking and b
// answering with step 7 (under StepServer, with inbound caps of 8 per
// peer and 512 in all), in the caller's bubble.
type stepPair struct {
	a, b      host.Host
	asker     *Asker
	server    *StepServer
	stale     prometheus.Counter
	malformed prometheus.Counter
}

// stepAnswer answers every query with step 7.
type stepAnswer struct{}

func (stepAnswer) Leaving(peer.ID) {}
func (stepAnswer) Answer(peer.ID, StepRequest) (StepReply, bool, bool) {
	return StepReply{Step: 7}, true, false
}

func newStepPair(t *testing.T, keep int) *stepPair {
	mn := memnet.New(0)
	t.Cleanup(func() { _ = mn.Close() })
	var hs [2]host.Host
	for i := range hs {
		h, err := mn.NewHost(10, 20)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = h.Close() })
		hs[i] = h
	}
	sp := &stepPair{a: hs[0], b: hs[1],
		stale:     prometheus.NewCounter(prometheus.CounterOpts{Name: "stale"}),
		malformed: prometheus.NewCounter(prometheus.CounterOpts{Name: "malformed"})}
	own := func() StepExt { return StepExt{} }
	sp.asker = NewAsker(sp.a, "t", keep, own, AskerMetrics{Stale: sp.stale})
	t.Cleanup(sp.asker.Close)
	in := NewInbound(8, 512)
	sp.server = &StepServer{Life: t.Context(), QueryTimeout: 5 * time.Second, Handler: stepAnswer{}, Inbound: in,
		Own: own, Malformed: sp.malformed, Log: slog.New(slog.DiscardHandler)}
	for _, id := range []protocol.ID{StepProtocol("t"), StepProtocolExt("t")} {
		sp.b.SetStreamHandler(id, func(s network.Stream) {
			sl, ok := in.Enter(s.Conn().RemotePeer(), s, func() {})
			if !ok {
				_ = s.Reset()
				return
			}
			defer in.Leave(sl)
			sp.server.Serve(s, s.Protocol() == StepProtocolExt("t"), sl)
		})
	}
	sp.a.Peerstore().AddAddrs(sp.b.ID(), sp.b.Addrs(), time.Hour)
	return sp
}

// streamsTo lists the open step streams (either version) from's host has
// with to.
func streamsTo(from, to host.Host) []network.Stream {
	var out []network.Stream
	for _, c := range from.Network().ConnsToPeer(to.ID()) {
		for _, s := range c.GetStreams() {
			if s.Protocol() == StepProtocol("t") || s.Protocol() == StepProtocolExt("t") {
				out = append(out, s)
			}
		}
	}
	return out
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	_ = c.Write(&m)
	return m.GetCounter().GetValue()
}

// Step queries to one peer reuse one stream; a stream the answerer closed
// costs a retry on a fresh one, not a failed query; a leave notice and
// keep = 0 do not keep streams.
func TestAskerReusesStreams(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		sp := newStepPair(t, 64)
		a, b := sp.asker, sp.b.ID()
		ctx := t.Context()
		query := func() {
			t.Helper()
			if r, err := a.Ask(ctx, b, StepRequest{Step: 1}, 5*time.Second); err != nil || r.Step != 7 {
				t.Fatalf("query: %+v, %v", r, err)
			}
		}

		query()
		first := a.idle[b]
		if first == nil {
			t.Fatal("no idle stream kept after a query")
		}
		for range 5 {
			query()
		}
		if got := a.idle[b]; got == nil || got.s.ID() != first.s.ID() {
			t.Fatalf("the idle stream changed over five queries")
		}
		if got := len(streamsTo(sp.a, sp.b)); got != 1 {
			t.Errorf("a holds %d step streams to b, want 1", got)
		}

		// b closes its end (as at its idle timeout): the next query retries.
		for _, s := range streamsTo(sp.b, sp.a) {
			_ = s.Close()
		}
		synctest.Wait() // the close has reached a's end
		query()
		if got := counterValue(sp.stale); got != 1 {
			t.Errorf("stale-stream retries %v, want 1", got)
		}

		// A leave notice neither takes nor keeps a stream.
		kept := a.idle[b]
		if _, err := a.Ask(ctx, b, StepRequest{Step: 1, Leaving: true}, 5*time.Second); err != nil {
			t.Fatalf("leave notice: %v", err)
		}
		if a.idle[b] != kept {
			t.Error("the leave notice used or replaced the idle stream")
		}

		// With keep = 0 every query has its own stream.
		a.Close()
		sp.asker = NewAsker(sp.a, "t", 0, func() StepExt { return StepExt{} }, AskerMetrics{})
		a = sp.asker
		query()
		if got := len(a.idle); got != 0 {
			t.Errorf("keep 0 kept %d idle streams", got)
		}
	})
}

// A malformed request later on a reused stream is counted and the stream
// reset, like a malformed first request; the answerer goes on serving.
func TestStepServerMalformedLaterRequest(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		sp := newStepPair(t, 64)
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		s, err := sp.a.NewStream(ctx, sp.b.ID(), StepProtocol("t"))
		if err != nil {
			t.Fatal(err)
		}
		c := NewStepConn(s, false)
		if _, err := c.Ask(ctx, StepRequest{Step: 1}, StepExt{}, time.Now().Add(5*time.Second)); err != nil {
			t.Fatalf("first exchange: %v", err)
		}
		if err := WriteFrame(s, []byte{0xff, 0xff, 0xff}); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadFrame(c.r, MaxStepFrame); err == nil {
			t.Fatal("a malformed request got a reply")
		}
		if got := counterValue(sp.malformed); got != 1 {
			t.Errorf("malformed requests counted %v, want 1", got)
		}
		if _, err := sp.asker.Ask(ctx, sp.b.ID(), StepRequest{Step: 1}, 5*time.Second); err != nil {
			t.Errorf("b stopped answering after a malformed request: %v", err)
		}
	})
}

// blockingStream is a step stream whose Close and Reset block until
// release is closed, as on a congested connection.
type blockingStream struct {
	network.Stream
	entered chan struct{} // closed when Close or Reset is first called
	release chan struct{}
	once    sync.Once
}

func (s *blockingStream) block() error {
	s.once.Do(func() { close(s.entered) })
	<-s.release
	return nil
}
func (s *blockingStream) Close() error { return s.block() }
func (s *blockingStream) Reset() error { return s.block() }

// A stream that blocks as it is closed or reset holds up only its own
// peer: the asker serves other peers meanwhile. (It closed and reset
// streams under its lock, so one congested peer stalled every query.)
func TestAskerDoesNotBlockOnOnePeer(t *testing.T) {
	for _, tc := range []struct {
		name string
		stop func(a *Asker, p peer.ID, c *StepConn)
	}{
		{"drop", func(a *Asker, p peer.ID, _ *StepConn) { a.Drop(p) }},
		{"expired on take", func(a *Asker, p peer.ID, _ *StepConn) { a.take(p, time.Now().Add(time.Hour)) }},
		{"full on put", func(a *Asker, p peer.ID, c *StepConn) { a.put(p, c, time.Now()) }},
		{"close", func(a *Asker, _ peer.ID, _ *StepConn) { a.Close() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vclock.Test(t, func(t *testing.T) {
				a := NewAsker(nil, "t", 1, nil, AskerMetrics{})
				slow, other := peer.ID("slow"), peer.ID("other")
				bs := &blockingStream{entered: make(chan struct{}), release: make(chan struct{})}
				c := &StepConn{s: bs}
				a.put(slow, c, time.Now())
				stopped := make(chan struct{})
				go func() {
					defer close(stopped)
					tc.stop(a, slow, c) // blocks in the stream's Close or Reset
				}()
				<-bs.entered
				done := make(chan struct{})
				go func() {
					defer close(done)
					a.take(other, time.Now())
					a.Drop(other)
				}()
				select {
				case <-done:
				case <-time.After(10 * time.Second):
					t.Error("the asker stalled on another peer's stream close for 10 s")
				}
				close(bs.release)
				<-stopped
				<-done
			})
		})
	}
}
