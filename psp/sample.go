package psp

import "math/rand/v2"

// SampleIndices returns k distinct integers drawn uniformly at random,
// without replacement, from [0, n), appended to dst[:0]. Every k-subset is
// equally likely. It uses Robert Floyd's algorithm: k random draws whatever
// n is, and no O(n) state, so a node can sample from a large population
// cheaply. k is clamped to [0, n].
func SampleIndices(rng *rand.Rand, n, k int, dst []int) []int {
	dst = dst[:0]
	k = max(0, min(k, n))
	if k == 0 {
		return dst
	}
	var seen map[int]struct{}
	if k > 32 { // a linear scan is faster for the small β that PSP uses
		seen = make(map[int]struct{}, k)
	}
	has := func(v int) bool {
		if seen != nil {
			_, ok := seen[v]
			return ok
		}
		for _, x := range dst {
			if x == v {
				return true
			}
		}
		return false
	}
	for j := n - k; j < n; j++ {
		t := rng.IntN(j + 1)
		if has(t) {
			t = j
		}
		dst = append(dst, t)
		if seen != nil {
			seen[t] = struct{}{}
		}
	}
	return dst
}

// SampleOthers is SampleIndices over [0, n) without self: k distinct
// indices, none equal to self, uniform over the other n-1.
func SampleOthers(rng *rand.Rand, n, self, k int, dst []int) []int {
	if self < 0 || self >= n {
		return SampleIndices(rng, n, k, dst)
	}
	dst = SampleIndices(rng, n-1, k, dst)
	for i, v := range dst {
		if v >= self {
			dst[i] = v + 1
		}
	}
	return dst
}
