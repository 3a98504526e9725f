package exchange

import (
	"encoding/binary"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/gossip"
	"github.com/pspnode/pspnode/internal/memnet"
	"github.com/pspnode/pspnode/internal/vclock"
	"github.com/pspnode/pspnode/internal/wire"
)

// fragmentPair is two epidemic exchanges of a model of n values cut into
// fa and fb fragments, on two connected memnet hosts: a sends, b serves.
func fragmentPair(t *testing.T, n, fa, fb int, enc byte) (a, b *epidemic, bHost *memnet.Host) {
	t.Helper()
	hs := twoHosts(t)
	mk := func(h *memnet.Host, f int) *epidemic {
		base, _ := testBase(t, n, 1, 0)
		base.cfg.Fragments, base.cfg.Encoding = f, enc
		base.d.Host, base.d.Life, base.d.SendTimeout = h, t.Context(), time.Second
		e := newEpidemic(base)
		h.SetStreamHandler(wire.ExchangeProtocol("test"), e.Serve)
		return e
	}
	a, b = mk(hs[0], fa), mk(hs[1], fb)
	if err := hs[0].Connect(t.Context(), peer.AddrInfo{ID: hs[1].ID(), Addrs: hs[1].Addrs()}); err != nil {
		t.Fatal(err)
	}
	return a, b, hs[1]
}

// twoHosts are two hosts of a memnet network, closed with the test.
func twoHosts(t *testing.T) [2]*memnet.Host {
	t.Helper()
	mn := memnet.New(0)
	t.Cleanup(func() { _ = mn.Close() })
	var hs [2]*memnet.Host
	for i := range hs {
		h, err := mn.NewHost(10, 20)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = h.Close() })
		hs[i] = h
	}
	return hs
}

// waitFor waits (on the virtual clock) until ok.
func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A round of a model cut into fragments carries one fragment, the
// step's (step mod F), over the wire: its bytes alone go, and the
// receiver averages that range alone, keeping the rest of its model as
// its trainer gave it.
func TestFragmentRoundOverTheWire(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		const n, F = 12, 3
		a, b, bh := fragmentPair(t, n, F, F, wire.EncodingFloat32)
		xa, xb := make([]float32, n), make([]float32, n)
		for i := range xa {
			xa[i], xb[i] = 1, 3
		}
		b.Push(t.Context(), 0, xb, nil) // b's model, to judge by
		a.Push(t.Context(), 4, xa, nil) // step 4: fragment 1, values [4, 8)
		a.sendTo(bh.ID(), 4)
		waitFor(t, "the fragment taken", func() bool { return b.Stats().Received == 1 })
		if st := a.Stats(); st.Sent != 1 || st.SentBytes != 8+4*4 {
			t.Errorf("sent %d models, %d bytes: want 1 of the fragment's %d", st.Sent, st.SentBytes, 8+4*4)
		}
		if st := b.Stats(); st.ReceivedBytes != 4*4 {
			t.Errorf("received %d bytes, want the fragment's %d", st.ReceivedBytes, 4*4)
		}
		x := slices.Clone(xb)
		if k := b.Merge(4, x); k != 1 {
			t.Errorf("averaged %d models, want 1", k)
		}
		want := []float32{3, 3, 3, 3, 2, 2, 2, 2, 3, 3, 3, 3}
		if !slices.Equal(x, want) || !slices.Equal(b.refOf(), want) {
			t.Errorf("after the round: model %v, reference %v; want %v", x, b.refOf(), want)
		}
	})
}

// A fragment of another F, of a range that is not one of the receiver's
// fragments, with a NaN, or with a bad int8 scale is refused, counted by
// reason, and the receiver's round goes on: a good fragment after them
// is averaged as if they had not come.
func TestFragmentRefusals(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		const n = 600
		a, b, bh := fragmentPair(t, n, 2, 2, wire.EncodingFloat32)
		b.Push(t.Context(), 0, make([]float32, n), nil)
		lay := wire.Layout{N: n, F: 2}
		offer := func(f int) wire.Offer {
			first, count := lay.FragmentBlocks(f)
			return wire.Offer{Kind: byte(Epidemic), Encoding: wire.EncodingFloat32, Step: 1, ModelID: 7, N: n,
				Block: wire.ExchangeBlock, First: uint32(first), Count: uint32(count), Fragment: uint32(f), Fragments: 2}
		}
		fill := func(v float32) func(int, []float32) {
			return func(_ int, dst []float32) {
				for i := range dst {
					dst[i] = v
				}
			}
		}
		x := make([]float32, n)
		for step, tc := range []struct {
			name string
			o    func() wire.Offer
			fill func(int, []float32)
			why  gossip.Reason
		}{
			{"another F", func() wire.Offer { o := offer(1); o.Fragments = 3; return o }, fill(1), wire.ReasonFragmentMismatch},
			{"a whole model", func() wire.Offer {
				o := offer(0)
				o.Fragment, o.Fragments, o.Count = 0, 0, 1
				return o
			}, fill(1), wire.ReasonFragmentMismatch},
			{"an index beyond F", func() wire.Offer { o := offer(1); o.Fragment = 2; return o }, fill(1), wire.ReasonBadFragment},
			{"another fragment's range", func() wire.Offer { o := offer(1); o.Fragment = 0; return o }, fill(1), wire.ReasonBadFragment},
			{"a NaN", func() wire.Offer { return offer(1) }, fill(float32(math.NaN())), gossip.ReasonNonFinite},
			{"a bad int8 scale", func() wire.Offer { o := offer(1); o.Encoding = wire.EncodingInt8; return o }, nil, wire.ReasonBadScale},
		} {
			was := b.Stats()
			if tc.fill != nil {
				reason, _, _, err := wire.SendModel(t.Context(), a.d.Host, bh.ID(), "test", tc.o(), tc.fill, nil, time.Second)
				if err != nil || reason != tc.why {
					t.Errorf("%s: refused for %q (%v), want %q", tc.name, reason, err, tc.why)
				}
			} else {
				sendBadScale(t, a, bh.ID(), tc.o()) // the receiver resets the stream at the bad chunk
			}
			r := string(tc.why)
			waitFor(t, tc.name+" counted", func() bool {
				st := b.Stats()
				return st.Declined[r]+st.Rejected[r] == was.Declined[r]+was.Rejected[r]+1
			})
			// A round of fragment 0: a sender whose model was refused
			// block by block may send again in the next round.
			b.Merge(int64(2*step+2), x)
		}
		if st := b.Stats(); st.Received != 0 {
			t.Fatalf("%d models taken of the refused ones", st.Received)
		}
		// The round goes on: a good fragment 1 is averaged alone.
		if reason, _, _, err := wire.SendModel(t.Context(), a.d.Host, bh.ID(), "test", offer(1), fill(2), nil, time.Second); reason != "" || err != nil {
			t.Fatalf("a good fragment: %q, %v", reason, err)
		}
		if k := b.Merge(1, x); k != 1 || x[0] != 0 || x[n/2-1] != 0 || x[n/2] != 1 || x[n-1] != 1 {
			t.Errorf("averaged %d: x[0] %v, x[n/2-1] %v, x[n/2] %v, x[n-1] %v; want 1 model, 0, 0, 1, 1", k, x[0], x[n/2-1], x[n/2], x[n-1])
		}
	})
}

// A fragment that comes ahead of its turn (a peer a step ahead) waits
// for it: the receiver's round of another fragment leaves it, and the
// fragment's own round averages it.
func TestFragmentWaitsForItsTurn(t *testing.T) {
	base, _ := testBase(t, 8, 1, 0)
	base.cfg.Fragments = 2
	e := newEpidemic(base)
	e.setRef(make([]float32, 8)...)
	lay := e.lay
	first, count := lay.FragmentBlocks(1)
	o := wire.Offer{Kind: byte(Epidemic), Encoding: wire.EncodingFloat32, Step: 3, ModelID: 7, N: 8, Block: wire.ExchangeBlock,
		First: uint32(first), Count: uint32(count), Fragment: 1, Fragments: 2}
	from := peer.ID("ahead")
	if r := o.CheckLayout(7, lay); r != "" {
		t.Fatal(r)
	}
	if r := e.Offer(from, o); r != "" {
		t.Fatal(r)
	}
	y := []float32{4, 4, 4, 4}
	if r := e.Block(from, o, first, y); r != "" {
		t.Fatal(r)
	}
	e.End(from, o, 1, "")
	x := make([]float32, 8)
	if k := e.Merge(2, x); k != 0 || slices.ContainsFunc(x, func(v float32) bool { return v != 0 }) {
		t.Errorf("fragment 0's round averaged %d and made %v: want nothing of fragment 1's", k, x)
	}
	if k := e.Merge(3, x); k != 1 || !slices.Equal(x, []float32{0, 0, 0, 0, 2, 2, 2, 2}) {
		t.Errorf("fragment 1's round averaged %d and made %v", k, x)
	}
}

// sendBadScale offers o (int8, one block) to p and sends its block with
// a NaN scale, which no encoder of this package makes, and waits for the
// stream's end.
func sendBadScale(t *testing.T, e *epidemic, p peer.ID, o wire.Offer) {
	t.Helper()
	s, err := e.d.Host.NewStream(t.Context(), p, wire.ExchangeProtocol("test"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	if _, err := s.Write(wire.AppendOffer(nil, o)); err != nil {
		t.Fatal(err)
	}
	r := wire.SmallReader(s, 16)
	if v, err := wire.ReadFrame(r, 3); err != nil || v[1] != 0 {
		t.Fatalf("verdict % x, %v", v, err)
	}
	lo, hi := o.Layout().Range(int(o.First))
	blk := binary.BigEndian.AppendUint32(nil, o.First)
	blk = binary.BigEndian.AppendUint32(blk, uint32(hi-lo))
	blk = binary.LittleEndian.AppendUint32(blk, math.Float32bits(float32(math.NaN()))) // the first chunk's scale
	blk = append(blk, make([]byte, min(hi-lo, wire.Int8Chunk))...)
	_, _ = s.Write(blk)
	_ = s.CloseWrite()
	_, _ = wire.ReadFrame(r, 3) // the final answer, or the reset
}
