package overlay

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
	"time"
)

// synthIDs returns n uniform 32-byte keys.
func synthIDs(r *rand.Rand, n int) [][]byte {
	ids := make([][]byte, n)
	for i := range ids {
		var b [8]byte
		binary.BigEndian.PutUint64(b[:], r.Uint64())
		h := sha256.Sum256(b[:])
		ids[i] = h[:]
	}
	return ids
}

// perfectTable returns what an ideal Kademlia routing table of self holds:
// counts by CPL, each bucket capped at k, and which buckets are full.
func perfectTable(self []byte, others [][]byte, k int) ([]int, []bool) {
	counts := make([]int, keyBits+1)
	for _, o := range others {
		counts[cpl(self, o)]++
	}
	full := make([]bool, keyBits+1)
	for j := range counts {
		if counts[j] >= k {
			counts[j] = k
			full[j] = true
		}
	}
	return counts, full
}

func TestCPL(t *testing.T) {
	a := []byte{0b1010_0000, 0xff}
	tests := []struct {
		b    []byte
		want int
	}{
		{[]byte{0b1010_0000, 0xff}, 16},
		{[]byte{0b0010_0000, 0xff}, 0},
		{[]byte{0b1011_0000, 0xff}, 3},
		{[]byte{0b1010_0000, 0x7f}, 8},
	}
	for _, tc := range tests {
		if got := cpl(a, tc.b); got != tc.want {
			t.Errorf("cpl(%08b, %08b) = %d, want %d", a, tc.b, got, tc.want)
		}
	}
}

// TestZoneEstimatorSynthetic checks N̂ = 1 + 2^c·n_c on ideal routing
// tables over uniform ID sets of known size: unbiased (mean signed error
// within 2 %; counting the first bucket below the deepest full one read 3 %
// low), and within ±2 stated standard errors about 95 % of the time.
func TestZoneEstimatorSynthetic(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{10, 50, 200, 1000, 5000} {
		const trials = 600
		var relErrs []float64
		within2 := 0
		bias := 0.0
		for range trials {
			ids := synthIDs(r, n)
			counts, full := perfectTable(ids[0], ids[1:], 20)
			est, err := estimateZone(counts, full, 4)
			if err != nil {
				t.Fatalf("N=%d: %v", n, err)
			}
			bias += (est.N/float64(n) - 1) / trials
			relErrs = append(relErrs, math.Abs(est.N-float64(n))/float64(n))
			if math.Abs(est.N-float64(n)) <= 2*est.SE+0.5 {
				within2++
			}
			if n <= 20 && est.N != float64(n) {
				t.Fatalf("N=%d: complete table should give exact N, got %.1f", n, est.N)
			}
		}
		sort.Float64s(relErrs)
		med := relErrs[trials/2]
		cover := float64(within2) / trials
		t.Logf("zone N=%d: mean signed error %+.3f, median rel err %.3f, p95 %.3f, ±2SE coverage %.2f", n, bias, med, relErrs[trials*95/100], cover)
		if med > 0.25 {
			t.Errorf("N=%d: median relative error %.3f > 0.25", n, med)
		}
		if math.Abs(bias) > 0.02 {
			t.Errorf("N=%d: biased: mean signed error %+.3f", n, bias)
		}
		if cover < 0.85 {
			t.Errorf("N=%d: only %.0f%% within 2 stated SE", n, 100*cover)
		}
	}
}

func TestZoneEstimatorTooFew(t *testing.T) {
	counts := make([]int, keyBits+1)
	full := make([]bool, keyBits+1)
	if _, err := estimateZone(counts, full, 4); !errors.Is(err, ErrTooFewPeers) {
		t.Fatalf("empty table: err = %v, want ErrTooFewPeers", err)
	}
	// A full bucket at CPL 3 and only 2 peers deeper: too few.
	full[3], counts[3], counts[5] = true, 20, 2
	if _, err := estimateZone(counts, full, 4); !errors.Is(err, ErrTooFewPeers) {
		t.Fatalf("thin zone: err = %v, want ErrTooFewPeers", err)
	}
	// The zone starts one below the first bucket after the full one...
	counts[6] = 3
	counts[7] = 2
	est, err := estimateZone(counts, full, 4)
	if err != nil || est.Depth != 5 || est.Count != 7 || est.N != 1+32*7 {
		t.Fatalf("got %+v, %v; want depth 5, count 7, N 225", est, err)
	}
	// ... unless that leaves fewer than minPeers: then at that bucket.
	counts[5], counts[6], counts[7], counts[4] = 0, 1, 0, 4
	est, err = estimateZone(counts, full, 4)
	if err != nil || est.Depth != 4 || est.Count != 5 || est.N != 1+16*5 {
		t.Fatalf("got %+v, %v; want depth 4, count 5, N 81", est, err)
	}
}

// normDistance returns XOR(a, b) / 2^256 for two 32-byte keys, using the
// top 64 bits (ample precision for distances above 2^-50).
func normDistance(a, b []byte) float64 {
	var x [8]byte
	for i := 0; i < 8 && i < len(a) && i < len(b); i++ {
		x[i] = a[i] ^ b[i]
	}
	return normXOR(x[:])
}

// orderSamples simulates L random-key lookups over the other IDs.
func orderSamples(r *rand.Rand, others [][]byte, lookups, k int) []lookupSample {
	var out []lookupSample
	kk := min(k, len(others))
	closest := make([]float64, 0, kk) // the kk smallest distances so far, ascending
	for range lookups {
		key := synthIDs(r, 1)[0]
		closest = closest[:0]
		for _, o := range others {
			d := normDistance(o, key)
			if len(closest) == kk && d >= closest[kk-1] {
				continue // most peers: not among the kk closest (no full sort needed)
			}
			i, _ := slices.BinarySearch(closest, d)
			if len(closest) < kk {
				closest = append(closest, 0)
			}
			copy(closest[i+1:], closest[i:len(closest)-1])
			closest[i] = d
		}
		out = append(out, lookupSample{At: time.Now(), K: kk, DK: closest[kk-1]})
	}
	return out
}

// TestOrderEstimatorSynthetic checks the order-statistics estimator against
// known N: relative error near its stated 1/√(ΣK) and ±2SE coverage.
func TestOrderEstimatorSynthetic(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{12, 100, 1000, 5000} {
		const trials = 200
		var relErrs []float64
		within2 := 0
		for range trials {
			ids := synthIDs(r, n)
			samples := orderSamples(r, ids[1:], 10, 20)
			est, se, err := estimateOrder(samples, 20, 3)
			if err != nil {
				t.Fatalf("N=%d: %v", n, err)
			}
			relErrs = append(relErrs, math.Abs(est-float64(n))/float64(n))
			if math.Abs(est-float64(n)) <= 2*se+0.5 {
				within2++
			}
		}
		sort.Float64s(relErrs)
		med := relErrs[trials/2]
		cover := float64(within2) / trials
		t.Logf("order N=%d: median rel err %.3f, p95 %.3f, ±2SE coverage %.2f", n, med, relErrs[trials*95/100], cover)
		if med > 0.08 {
			t.Errorf("N=%d: median relative error %.3f > 0.08 (stated SE ≈ 0.071)", n, med)
		}
		if cover < 0.88 {
			t.Errorf("N=%d: only %.0f%% within 2 stated SE", n, 100*cover)
		}
	}
	if _, _, err := estimateOrder(nil, 20, 3); !errors.Is(err, ErrTooFewPeers) {
		t.Errorf("no lookups: err = %v, want ErrTooFewPeers", err)
	}
	one := []lookupSample{{K: 20, DK: 0.01}}
	if _, _, err := estimateOrder(one, 20, 3); !errors.Is(err, ErrTooFewPeers) {
		t.Errorf("one lookup: err = %v, want ErrTooFewPeers", err)
	}
}

func TestFuse(t *testing.T) {
	n, se, ok := fuseIV([]float64{100, 200}, []float64{10, 10})
	if !ok || math.Abs(n-150) > 1e-9 || math.Abs(se-10/math.Sqrt2) > 1e-9 {
		t.Fatalf("fuseIV equal weights = %v ± %v", n, se)
	}
	n, _, _ = fuseIV([]float64{100, 200}, []float64{1, 100})
	if math.Abs(n-100) > 0.1 {
		t.Fatalf("fuseIV should follow the precise estimate, got %v", n)
	}
	if _, _, ok := fuseIV([]float64{1}, []float64{0}); ok {
		t.Fatal("fuseIV with zero SE only should fail")
	}

	// Reports: a hostile extreme report is trimmed.
	reps := []float64{1000, 1010, 990, 1005, 995, 1002, 998, 1e9, 1001, 999}
	f, fse, err := fuseReports(1000, 100, true, reps, 1)
	if err != nil || math.Abs(f-1000) > 5 {
		t.Fatalf("fuseReports = %v ± %v, %v; want ≈1000", f, fse, err)
	}
	if fse >= 100 {
		t.Errorf("fused SE %v did not shrink below local 100", fse)
	}
	if _, _, err := fuseReports(0, 0, false, []float64{5, 6}, 1); !errors.Is(err, ErrTooFewPeers) {
		t.Errorf("two reports and no local: err = %v", err)
	}
	if f, _, err := fuseReports(0, 0, false, []float64{500, 510, 490}, 1); err != nil || math.Abs(f-500) > 1 {
		t.Errorf("reports only = %v, %v", f, err)
	}
}

// TestFusedNetworkEstimate fuses, as the node does, every node's local
// estimate (zone + order statistics over a perfect table) with ten peers'
// reports, and checks the targets (median ≤ 10 %, p95 ≤ 25 %) on a
// synthetic population.
func TestFusedNetworkEstimate(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	const n = 400
	ids := synthIDs(r, n)
	local := make([]float64, n)
	lse := make([]float64, n)
	for i := range ids {
		others := append(append([][]byte{}, ids[:i]...), ids[i+1:]...)
		counts, full := perfectTable(ids[i], others, 20)
		z, zerr := estimateZone(counts, full, 4)
		on, ose, oerr := estimateOrder(orderSamples(r, others, 9, 20), 20, 3)
		if zerr != nil || oerr != nil {
			t.Fatal(zerr, oerr)
		}
		local[i], lse[i], _ = fuseIV([]float64{z.N, on}, []float64{z.SE, ose})
	}
	var errsLocal, errsFused []float64
	for i := range ids {
		var reps []float64
		for _, j := range r.Perm(n)[:11] {
			if j != i && len(reps) < 10 {
				reps = append(reps, local[j])
			}
		}
		f, _, err := fuseReports(local[i], lse[i], true, reps, 1)
		if err != nil {
			t.Fatal(err)
		}
		errsLocal = append(errsLocal, math.Abs(local[i]-n)/n)
		errsFused = append(errsFused, math.Abs(f-n)/n)
	}
	sort.Float64s(errsLocal)
	sort.Float64s(errsFused)
	t.Logf("local: median %.3f p95 %.3f; fused: median %.3f p95 %.3f",
		errsLocal[n/2], errsLocal[n*95/100], errsFused[n/2], errsFused[n*95/100])
	if errsFused[n/2] > 0.10 || errsFused[n*95/100] > 0.25 {
		t.Errorf("fused estimate misses targets: median %.3f, p95 %.3f", errsFused[n/2], errsFused[n*95/100])
	}
}

func TestTrimmedMean(t *testing.T) {
	m, _ := trimmedMean([]float64{1, 2, 3})
	if m != 2 {
		t.Fatalf("mean = %v", m)
	}
	m, _ = trimmedMean([]float64{10, 10, 10, 10, -1e6})
	if m != 10 {
		t.Fatalf("trimmed mean = %v, want 10", m)
	}
}

// TestOrderEstimateRecentLookups checks that the order-statistics estimate
// counts only the MaxLookups most recent lookups of its window: lookups
// made while a network was still forming (here: as if N were 50) stop
// counting as soon as enough newer ones (N = 200) have come in.
func TestOrderEstimateRecentLookups(t *testing.T) {
	cfg := DefaultConfig()
	o := bareOverlay(t, cfg)
	r := rand.New(rand.NewPCG(3, 4))
	now := time.Now()
	sample := func(n int, at time.Time) lookupSample {
		// The k-th closest of n−1 uniform IDs to a key: Gamma(k, n−1).
		d := 0.0
		for range cfg.BucketSize {
			d += r.ExpFloat64() / float64(n-1)
		}
		return lookupSample{At: at, K: cfg.BucketSize, DK: d}
	}
	o.mu.Lock()
	for i := range 12 {
		o.lookups = append(o.lookups, sample(50, now.Add(time.Duration(i-20)*time.Second)))
	}
	for i := range cfg.MaxLookups {
		o.lookups = append(o.lookups, sample(200, now.Add(time.Duration(i-8)*time.Second)))
	}
	o.mu.Unlock()
	d := o.EstimateDetail()
	if d.Lookups != cfg.MaxLookups {
		t.Errorf("%d lookups counted, want MaxLookups = %d", d.Lookups, cfg.MaxLookups)
	}
	if math.Abs(d.OrderN-200)/200 > 0.25 {
		t.Errorf("order-statistics estimate %.0f, want about 200 (the recent lookups only)", d.OrderN)
	}
}
