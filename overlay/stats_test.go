package overlay

import "math"

// chiSquareP returns P(χ²_k ≥ x) by the Wilson–Hilferty approximation
// (accurate to about 1e-3 for k ≥ 10).
func chiSquareP(x float64, k int) float64 {
	fk := float64(k)
	z := (math.Cbrt(x/fk) - (1 - 2/(9*fk))) / math.Sqrt(2/(9*fk))
	return 0.5 * math.Erfc(z/math.Sqrt2)
}

// uniformity summarises selection counts against a uniform expectation.
func uniformity(counts []int) (maxMean, minMean, chi2, p float64) {
	total := 0
	for _, c := range counts {
		total += c
	}
	mean := float64(total) / float64(len(counts))
	lo, hi := math.Inf(1), 0.0
	for _, c := range counts {
		fc := float64(c)
		lo, hi = math.Min(lo, fc), math.Max(hi, fc)
		chi2 += (fc - mean) * (fc - mean) / mean
	}
	return hi / mean, lo / mean, chi2, chiSquareP(chi2, len(counts)-1)
}
