package wire

import (
	"encoding/binary"
	"io"
	"log/slog"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/pspnode/pspnode/internal/f32"
	"github.com/pspnode/pspnode/internal/memnet"
	"github.com/pspnode/pspnode/internal/vclock"
)

// judge takes every offer and every block, recording them, and refuses
// a block holding a NaN.
type judge struct {
	mu     sync.Mutex
	offers int
	blocks []int
	ends   []Reason
}

func (j *judge) Offer(peer.ID, Offer) Reason {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.offers++
	return ""
}

func (j *judge) Block(_ peer.ID, _ Offer, b int, v []float32) Reason {
	if !f32.Within(v, f32.Limit(1e4)) {
		return ReasonNonFinite
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	j.blocks = append(j.blocks, b)
	return ""
}

func (j *judge) End(_ peer.ID, _ Offer, _ int, r Reason) Reason {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.ends = append(j.ends, r)
	return r
}

func counted(v *prometheus.CounterVec, label string) float64 {
	var m dto.Metric
	_ = v.WithLabelValues(label).Write(&m)
	return m.GetCounter().GetValue()
}

// connectedPair is two hosts of a memnet, the first connected to the
// second.
func connectedPair(t *testing.T) [2]host.Host {
	t.Helper()
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
	if err := hs[0].Connect(t.Context(), peer.AddrInfo{ID: hs[1].ID(), Addrs: hs[1].Addrs()}); err != nil {
		t.Fatal(err)
	}
	return hs
}

// A model comes whole in blocks; a block whose head is not the next
// expected, a body cut short, a stall past a wait's deadline, a block the
// judge refuses: each ends the transfer, is counted, and leaves the blocks
// taken before it taken, nothing of itself.
func TestExchangeServerBlocks(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		hs := connectedPair(t)
		n := 2*ExchangeBlock + 3
		j := &judge{}
		rejected := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rejected"}, []string{"reason"})
		sv := &ExchangeServer{Life: t.Context(), Timeout: time.Second, Kind: 1, ModelID: 7, N: n, Judge: j,
			Budget: NewBlockBudget(2, n), Rejected: rejected, Log: slog.New(slog.DiscardHandler)}
		hs[1].SetStreamHandler(ExchangeProtocol("t"), sv.Serve)
		o := Offer{Kind: 1, Encoding: EncodingFloat32, Step: 3, ModelID: 7, N: uint32(n), Block: ExchangeBlock, Count: 3}
		fill := func(b int, dst []float32) {
			for i := range dst {
				dst[i] = float32(b)
			}
		}
		reason, _, st, err := SendModel(t.Context(), hs[0], hs[1].ID(), "t", o, fill, nil, time.Second)
		if err != nil || reason != "" || st.Blocks != 3 {
			t.Fatalf("a good model: %q, %+v, %v", reason, st, err)
		}
		// Raw streams: an offer, then what the test writes.
		raw := func(after []byte, wait time.Duration) {
			s, err := hs[0].NewStream(t.Context(), hs[1].ID(), ExchangeProtocol("t"))
			if err != nil {
				t.Fatal(err)
			}
			_, _ = s.Write(AppendOffer(nil, o))
			_, _, _ = readReply(SmallReader(s, 8))
			_, _ = s.Write(after)
			time.Sleep(wait) // a stalling sender: the server's deadline passes (virtual time)
			_ = s.CloseWrite()
			_, _ = io.Copy(io.Discard, s)
			_ = s.Close()
		}
		block := func(b, count int, v float32) []byte {
			h := binary.BigEndian.AppendUint32(nil, uint32(b))
			h = binary.BigEndian.AppendUint32(h, uint32(count))
			vals := make([]float32, count)
			for i := range vals {
				vals[i] = v
			}
			return f32.Append(h, vals)
		}
		cases := []struct {
			name  string
			bytes []byte
			wait  time.Duration
			why   Reason
			taken int // blocks the judge took
		}{
			{"wrong index", block(1, ExchangeBlock, 1), 0, ReasonBadBlock, 0},
			{"oversized block", block(0, ExchangeBlock+1, 1)[:8], 0, ReasonBadBlock, 0},
			{"truncated body", block(0, ExchangeBlock, 1)[:1000], 0, ReasonMalformed, 0},
			{"stall after a block", block(0, ExchangeBlock, 1), 3 * time.Second, ReasonMalformed, 1},
			{"a NaN in the second block", append(block(0, ExchangeBlock, 1), block(1, ExchangeBlock, float32(math.NaN()))...), 0, ReasonNonFinite, 1},
		}
		for _, tc := range cases {
			j.mu.Lock()
			j.blocks, j.ends = nil, nil
			j.mu.Unlock()
			before := counted(rejected, string(tc.why))
			raw(tc.bytes, tc.wait)
			deadline := time.Now().Add(5 * time.Second)
			for counted(rejected, string(tc.why)) == before && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			j.mu.Lock()
			if got := counted(rejected, string(tc.why)); got != before+1 || len(j.blocks) != tc.taken || len(j.ends) != 1 || j.ends[0] != tc.why {
				t.Errorf("%s: counted %v (was %v), blocks %v, ends %v", tc.name, got, before, j.blocks, j.ends)
			}
			j.mu.Unlock()
		}
	})
}

// An offer that is not for this node's model is declined before any of
// its bytes: the sender learns why and sends nothing more.
func TestExchangeOfferDeclined(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Offer)
		why  Reason
	}{
		{"another model", func(o *Offer) { o.ModelID = 8 }, ReasonModelMismatch},
		{"another length", func(o *Offer) { o.N++ }, ReasonWrongLength},
		{"another block size", func(o *Offer) { o.Block = 1024 }, ReasonBadBlock},
		{"beyond the model", func(o *Offer) { o.First = 1 }, ReasonBadBlock},
		{"negative step", func(o *Offer) { o.Step = -1 }, ReasonNegativeStep},
		{"another encoding", func(o *Offer) { o.Encoding = 9 }, ReasonBadEncoding},
	} {
		o := Offer{Kind: 1, Encoding: EncodingFloat32, Step: 3, ModelID: 7, N: 10, Block: ExchangeBlock, Count: 1}
		tc.edit(&o)
		b := AppendOffer(nil, o)
		got, err := ParseOffer(b[1:])
		if err != nil || got != o {
			t.Fatalf("%s: the offer came back %+v, %v", tc.name, got, err)
		}
		if r := got.Check(7, 10); r != tc.why {
			t.Errorf("%s: %q, want %q", tc.name, r, tc.why)
		}
	}
	if _, err := ParseOffer(make([]byte, OfferLen-1)); err == nil {
		t.Error("a short offer parsed")
	}
}
