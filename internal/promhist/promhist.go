// Package promhist reads quantiles out of Prometheus histograms as a
// scrape of /metrics gives them: cumulative counts by upper bound. The
// comparison harnesses and the netns testnet's report add the histograms
// of several daemons together and then ask for a quantile, which is what
// PromQL's histogram_quantile does on a server; this is that estimate,
// without a server.
package promhist

import "math"

// Quantile estimates the q-quantile of a histogram with cumulative counts
// cum by upper bounds le (both in increasing order of bound, the last
// bound +Inf, so that the last count is the total), as
// histogram_quantile does: linear within the bucket that holds the rank,
// the first bucket starting at 0 (or at its own bound when that is not
// positive); a rank in the +Inf bucket gives the largest finite bound.
// NaN when the histogram is empty or its counts are not cumulative.
func Quantile(le, cum []float64, q float64) float64 {
	if len(le) == 0 || len(cum) != len(le) || !(cum[len(cum)-1] > 0) {
		return math.NaN()
	}
	rank := q * cum[len(cum)-1]
	for i, c := range cum {
		if c < rank {
			continue
		}
		if math.IsInf(le[i], 1) {
			if i == 0 {
				return math.NaN()
			}
			return le[i-1]
		}
		lo, below := 0.0, 0.0
		if i > 0 {
			lo, below = le[i-1], cum[i-1]
		} else if le[0] <= 0 {
			return le[0]
		}
		if c == below {
			return le[i]
		}
		return lo + (le[i]-lo)*(rank-below)/(c-below)
	}
	return math.NaN() // a count above the total: not cumulative
}
