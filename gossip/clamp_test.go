package gossip

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Every encoding clamps what it sends to ±MaxAbsValue, rounding included,
// so that a receiver with the same limit accepts every update; the
// clamped-off part stays in the residual (nothing is lost), and Clamped
// counts the clamped values.
func TestEncoderClampsAndKeepsTheRest(t *testing.T) {
	const n = 64
	for _, enc := range []Encoding{EncodingDense32, EncodingDense16, EncodingTopK32, EncodingTopK16} {
		// 0.1 is not a float32 (float32(0.1) > 0.1); 1e300 is beyond float32;
		// 1e5 is beyond float16. Deltas are float32: at most 1e37 here.
		for _, maxAbs := range []float64{0.1, 3, 1e4, 1e5, 1e300} {
			e, err := NewEncoder(n, enc, 0.25, maxAbs)
			if err != nil {
				t.Fatal(err)
			}
			lim := Limits{MaxMessageSize: MaxEncodedSize(n), ParamCount: n, ModelID: 7, MaxAbsValue: maxAbs}
			r := rand.New(rand.NewPCG(1, uint64(enc)))
			sent := make([]float64, n)
			want := make([]float64, n)
			mass := make([]float64, n) // Σ|delta|: the float64 sums' rounding scales with it
			clampedSeen := 0
			for step := int64(0); step < 40; step++ {
				delta := make([]float64, n)
				for i := range delta {
					delta[i] = float64(float32(r.NormFloat64() * min(maxAbs, 1e36)))
					if i%7 == 0 {
						delta[i] = float64(float32(math.Copysign(min(10*maxAbs, 1e37), delta[i]))) // far beyond the cap
					}
					if step >= 20 {
						delta[i] = 0 // let the residual drain
					}
					want[i] += delta[i]
					mass[i] += math.Abs(delta[i])
				}
				b, u := encodeDelta(t, e, delta, step)
				if _, err := Validate(b, testSender, step, lim); err != nil {
					t.Fatalf("%v max %g step %d: receiver rejects the update: %v", enc, maxAbs, step, err)
				}
				for j, v := range u.Values {
					i := j
					if u.Encoding.sparse() {
						i = int(u.Indices[j])
					}
					sent[i] += float64(v)
					if math.Abs(float64(v)) > maxAbs {
						t.Fatalf("%v max %g: sent %v", enc, maxAbs, v)
					}
				}
				clampedSeen += e.Clamped()
			}
			if clampedSeen == 0 && maxAbs < 1e37 {
				t.Errorf("%v max %g: no value counted as clamped", enc, maxAbs)
			}
			// Sent plus residual is everything that was given to the encoder.
			res := e.Residual()
			for i := range want {
				got := sent[i] + res[i]
				if d := math.Abs(got - want[i]); d > 1e-9*math.Max(1, mass[i]) {
					t.Fatalf("%v max %g: entry %d: sent %g + residual %g != %g", enc, maxAbs, i, sent[i], res[i], want[i])
				}
			}
		}
	}
}

// A delta beyond MaxAbsValue is published clamped, not dropped: the node
// that published it has applied all of it, so its peers must get all of it
// too, over the following updates. Publish used to refuse the whole delta.
func TestPublishClampsInsteadOfDropping(t *testing.T) {
	for _, enc := range []Encoding{EncodingDense32, EncodingDense16, EncodingTopK16} {
		t.Run(enc.String(), func(t *testing.T) {
			const n = 8
			const maxAbs = 0.1
			mn, hosts := mockHosts(t, 2)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			rec := &recorder{}
			reg := prometheus.NewRegistry()
			var gs [2]*Gossip
			for i := range gs {
				cfg := DefaultConfig()
				cfg.Job = "clamp"
				cfg.ParamCount = n
				cfg.Encoding = enc
				cfg.TopKFraction = 0.5
				cfg.MaxAbsValue = maxAbs
				if i == 0 {
					cfg.Registerer = reg
				} else {
					cfg.Handler = rec.handle
				}
				g, err := New(ctx, hosts[i], cfg)
				if err != nil {
					t.Fatal(err)
				}
				gs[i] = g
				defer g.Close()
			}
			if err := mn.ConnectAllButSelf(); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "topic peers", func() bool { return len(gs[0].Peers()) == 1 && len(gs[1].Peers()) == 1 })
			waitMeshes(t, ctx, gs[:]...)

			delta := []float64{0.5, float64(float32(-0.35)), float64(float32(0.1)), float64(float32(0.01)), 0, float64(float32(-0.1)), 0.25, 0}
			if err := gs[0].Publish(ctx, 1, f32s(delta)); err != nil {
				t.Fatalf("publish of a delta beyond MaxAbsValue: %v", err)
			}
			if c := gs[0].Stats().Clamped; c == 0 {
				t.Fatal("no clamped value counted")
			}
			if c := gathered(t, reg, "psp_gossip_clamped_values_total", ""); c != float64(gs[0].Stats().Clamped) {
				t.Fatalf("prometheus clamped %v, stats %d", c, gs[0].Stats().Clamped)
			}
			// Zero deltas drain the residual; the peer's sum converges on
			// the delta (to float16 precision for the float16 encodings).
			zero := make([]float64, n)
			const steps = 12
			for s := int64(2); s <= steps; s++ {
				if err := gs[0].Publish(ctx, s, f32s(zero)); err != nil {
					t.Fatal(err)
				}
			}
			waitFor(t, "deliveries", func() bool { return len(rec.updates()) == steps })
			if r := gs[1].Stats().TotalRejected(); r != 0 {
				t.Fatalf("receiver rejected %d updates", r)
			}
			sum := make([]float64, n)
			for _, u := range rec.updates() {
				for _, v := range u.Values {
					if math.Abs(float64(v)) > maxAbs {
						t.Fatalf("received %v beyond %v", v, maxAbs)
					}
				}
				add64(sum, &u)
			}
			tol := 1e-6
			if enc.half() {
				tol = 1e-3
			}
			for i := range delta {
				if math.Abs(sum[i]-delta[i]) > tol {
					t.Fatalf("peer's sum %v, want %v", sum, delta)
				}
			}
		})
	}
}

// NaN and ±Inf are errors the caller sees, and they leave the residual as
// it was.
func TestPublishNonFiniteIsAnError(t *testing.T) {
	e, err := NewEncoder(2, EncodingDense16, 1, 1e4)
	if err != nil {
		t.Fatal(err)
	}
	// Clamped to 65504: nearly all of it stays in the residual.
	if _, err := e.Encode([]float32{math.MaxFloat32, 0}); err != nil {
		t.Fatal(err)
	}
	before := e.Residual()
	for _, d := range [][]float32{
		{float32(math.NaN()), 0},
		{0, float32(math.Inf(-1))},
	} {
		if _, err := e.Encode(d); err == nil {
			t.Errorf("Encode(%v) succeeded", d)
		}
		if got := e.Residual(); got[0] != before[0] || got[1] != before[1] {
			t.Errorf("Encode(%v) changed the residual from %v to %v", d, before, got)
		}
	}
}

// A dense32 delta within MaxAbsValue goes into its message as it is while
// the encoder holds nothing back; once a delta is clamped, deltas take the
// encoder until the residual is sent, then go as they are again. A
// message that cannot be published is kept for the next.
func TestEncodeGoesAsItIsWhileNothingIsHeld(t *testing.T) {
	_, hosts := mockHosts(t, 1)
	cfg := DefaultConfig()
	cfg.Job, cfg.ParamCount, cfg.MaxAbsValue = "direct", 2, 1
	g, err := New(context.Background(), hosts[0], cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	for i, tc := range []struct {
		delta  []float32
		direct bool
	}{
		{[]float32{0.5, -0.25}, true},
		{[]float32{3, 0}, false}, // clamped to 1: 2 held back
		{[]float32{0, 0}, false}, // sends 1 of it
		{[]float32{0, 0}, false}, // sends the last 1
		{[]float32{0.5, 0}, true},
	} {
		m, err := g.Encode(int64(i+1), tc.delta)
		if err != nil {
			t.Fatal(err)
		}
		if direct := m.u == nil; direct != tc.direct {
			t.Fatalf("delta %d %v: as it is %v, want %v", i, tc.delta, direct, tc.direct)
		}
		if tc.direct {
			want, _ := AppendDense(nil, hosts[0].ID(), int64(i+1), cfg.ModelID, tc.delta)
			if !slices.Equal(m.data, want) {
				t.Fatalf("delta %d: the message differs from AppendDense's", i)
			}
		}
	}
	m, err := g.Encode(9, []float32{3, 0})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	if err := g.PublishEncoded(context.Background(), m); err != ErrClosed {
		t.Fatalf("publish after close: %v", err)
	}
	if res := g.enc.Residual(); res[0] != 3 {
		t.Fatalf("residual %v after a message not published, want all of it, 3", res)
	}
}
