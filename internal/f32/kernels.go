package f32

import "math"

// The kernels of a step's data path. Each is one pass over its vectors,
// done where the CPU allows it by the AVX2 loops of kernels_amd64.s (a
// scalar Go loop over float32 runs at about 0.6 ns a value here, four times
// the time of the memory traffic; the vector loops run at the memory's
// pace) and otherwise by the Go loops below, which define what each
// computes. Sums of squares are taken in float64 either way; the two
// differ only in the order of their additions.

// Limit is the bits of |bound| that Within compares against: the values
// whose magnitude is at most bound (which must be finite and positive).
func Limit(bound float32) uint32 { return math.Float32bits(bound) & 0x7fffffff }

// Within reports whether every value of v is finite and within the bound
// whose Limit is limit.
func Within(v []float32, limit uint32) bool {
	k := vecLen(len(v))
	if k > 0 && !withinVec(v[:k], limit) {
		return false
	}
	return withinGo(v[k:], limit)
}

func withinGo(v []float32, limit uint32) bool {
	for _, x := range v {
		if math.Float32bits(x)&0x7fffffff > limit {
			return false
		}
	}
	return true
}

// First returns the index of the first value of v that is not finite or
// beyond the bound whose Limit is limit, and that value; -1 for none.
func First(v []float32, limit uint32) (int, float32) {
	if Within(v, limit) {
		return -1, 0
	}
	for i, x := range v {
		if math.Float32bits(x)&0x7fffffff > limit {
			return i, x
		}
	}
	return -1, 0
}

// CheckDist returns the squared L2 distance between y and r (of one
// length) and whether every value of y is finite and within the bound of
// limit: how a received block is judged, in one pass.
func CheckDist(y, r []float32, limit uint32) (d2 float64, ok bool) {
	r = r[:len(y)]
	k := vecLen(len(y))
	ok = true
	if k > 0 {
		d2, ok = checkDistVec(y[:k], r[:k], limit)
	}
	t, tok := checkDistGo(y[k:], r[k:], limit)
	return d2 + t, ok && tok
}

func checkDistGo(y, r []float32, limit uint32) (float64, bool) {
	var s float64
	ok := true
	for i, x := range y {
		if math.Float32bits(x)&0x7fffffff > limit {
			ok = false
		}
		d := float64(x - r[i])
		s += d * d
	}
	return s, ok
}

// CopyDist2 copies src into dst (of one length) and returns the squared
// L2 distance between src and what dst held: a step's new model and the
// squared norm of the step that made it, in one pass.
func CopyDist2(dst, src []float32) float64 {
	src = src[:len(dst)]
	k := vecLen(len(dst))
	var s float64
	if k > 0 {
		s = copyDistVec(dst[:k], src[:k])
	}
	return s + copyDistGo(dst[k:], src[k:])
}

func copyDistGo(dst, src []float32) float64 {
	var s float64
	for i, x := range src {
		d := float64(x - dst[i])
		s += d * d
		dst[i] = x
	}
	return s
}

// StepMerge takes a step's model x into the average of a round and the
// reference r, in one pass: with a = Σ c_j y_j, the clipped sum of the
// round's models, s = Σ c_j and w = 1/(1 + k), it sets x and r (of one
// length with a) to x + (a − s·x)·w, Epidemic Learning's average of x and
// the round's models (each pulled toward x by its clip factor c_j), and
// returns the squared L2 distance between x and what r held: the squared
// norm of the step, when r held the model before it.
func StepMerge(x, r, a []float32, s, w float32) float64 {
	r, a = r[:len(x)], a[:len(x)]
	k := vecLen(len(x))
	var d2 float64
	if k > 0 {
		d2 = stepMergeVec(x[:k], r[:k], a[:k], s, w)
	}
	return d2 + stepMergeGo(x[k:], r[k:], a[k:], s, w)
}

func stepMergeGo(x, r, a []float32, s, w float32) float64 {
	var d2 float64
	for i, v := range x {
		d := float64(v - r[i])
		d2 += d * d
		m := v + (a[i]-s*v)*w
		x[i], r[i] = m, m
	}
	return d2
}

// ScaleTo sets dst to c × src (of one length).
func ScaleTo(dst, src []float32, c float32) {
	src = src[:len(dst)]
	k := vecLen(len(dst))
	if k > 0 {
		scaleVec(dst[:k], src[:k], c)
	}
	for i, x := range src[k:] {
		dst[k+i] = c * x
	}
}

// Axpy adds c × src to dst (of one length).
func Axpy(dst, src []float32, c float32) {
	src = src[:len(dst)]
	k := vecLen(len(dst))
	if k > 0 {
		axpyVec(dst[:k], src[:k], c)
	}
	for i, x := range src[k:] {
		dst[k+i] += c * x
	}
}

// SumSq is the sum of the squares of v, in float64.
func SumSq(v []float32) float64 {
	k := vecLen(len(v))
	var s float64
	if k > 0 {
		s = sumSqVec(v[:k])
	}
	for _, x := range v[k:] {
		s += float64(x) * float64(x)
	}
	return s
}
