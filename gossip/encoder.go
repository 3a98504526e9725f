package gossip

import (
	"fmt"
	"math"
)

// Encoder turns successive local deltas into updates with the configured
// encoding and keeps the error-feedback residual: whatever a step's update did
// not carry (entries outside the top k, float16/float32 rounding, clamping) is
// added to the next step's delta, so no part of any delta is lost, only
// delayed. For dense float32 of float32-representable values the residual stays
// zero and updates are exact.
//
// An Encoder is not safe for concurrent use; Gossip serialises its calls.
type Encoder struct {
	n        int
	enc      Encoding
	k        int
	maxAbs   float64
	clamped  int  // values the last Encode clamped to ±maxAbs
	holds    bool // the residual may hold a value not yet sent (Gossip.Encode's direct way waits until it does not)
	residual []float64
	acc      []float64
	mag      []float64 // scratch for top-k selection
}

// NewEncoder returns an encoder for n parameters. topKFraction (0, 1] sets
// k = ceil(fraction × n) for the top-k encodings and is ignored otherwise.
// Sent values are clamped to ±maxAbs (and to the float32 or float16 range);
// the clamped-off part stays in the residual. A sent value never exceeds
// maxAbs in magnitude, rounding included, so receivers with the same
// MaxAbsValue accept it.
func NewEncoder(n int, enc Encoding, topKFraction, maxAbs float64) (*Encoder, error) {
	if n <= 0 {
		return nil, fmt.Errorf("gossip: encoder: param count must be positive, got %d", n)
	}
	if !enc.valid() {
		return nil, fmt.Errorf("%w: %d", ErrUnknownEncoding, enc)
	}
	if !(maxAbs > 0) {
		return nil, fmt.Errorf("gossip: encoder: max abs value must be positive, got %v", maxAbs)
	}
	e := &Encoder{n: n, enc: enc, maxAbs: min(maxAbs, math.MaxFloat32)}
	if enc.half() {
		e.maxAbs = min(e.maxAbs, maxFloat16)
	}
	if enc.sparse() {
		if !(topKFraction > 0 && topKFraction <= 1) {
			return nil, fmt.Errorf("gossip: encoder: top-k fraction must be in (0, 1], got %v", topKFraction)
		}
		e.k = min(n, max(1, int(math.Ceil(topKFraction*float64(n)))))
	}
	return e, nil
}

// alloc makes the encoder's vectors at its first use: a node whose
// updates all go out as they are (dense float32 within MaxAbsValue, see
// Gossip.Encode) holds none of them (three float64 vectors: 6 copies of
// a float32 model). The residual is float64 so that what it keeps of
// each delta is kept exactly.
func (e *Encoder) alloc() {
	if e.residual != nil {
		return
	}
	e.residual, e.acc = make([]float64, e.n), make([]float64, e.n)
	if e.enc.sparse() {
		e.mag = make([]float64, e.n)
	}
}

// K is the number of entries a top-k update carries at most (n for dense).
func (e *Encoder) K() int {
	if e.enc.sparse() {
		return e.k
	}
	return e.n
}

// Residual returns a copy of the error-feedback residual.
func (e *Encoder) Residual() []float64 {
	e.alloc()
	return append([]float64(nil), e.residual...)
}

// Clamped returns how many values of the update the last Encode returned
// were clamped to ±maxAbs (or to the float16 range); what was clamped off
// is in the residual.
func (e *Encoder) Clamped() int { return e.clamped }

// Encode adds the residual to delta, chooses what to send, and keeps what it
// did not send as the new residual. The returned update has no Sender, Step
// or ModelID set. delta must have n finite entries; it is not modified.
// Entries larger than maxAbs are not an error: they are clamped, the rest
// stays in the residual and goes out in later updates (see Clamped).
// On error the residual is unchanged.
//
// If the update is then not delivered, call Restore with it so that its
// content returns to the residual.
func (e *Encoder) Encode(delta []float32) (*Update, error) {
	if len(delta) != e.n {
		return nil, fmt.Errorf("gossip: encode: delta has %d params, want %d", len(delta), e.n)
	}
	for i, d := range delta {
		if math.IsNaN(float64(d)) || math.IsInf(float64(d), 0) {
			return nil, fmt.Errorf("gossip: encode: delta[%d] = %v is not finite", i, d)
		}
	}
	e.alloc()
	for i, d := range delta {
		a := float64(d) + e.residual[i]
		if math.IsInf(a, 0) {
			return nil, fmt.Errorf("gossip: encode: delta[%d] = %v plus the residual %v overflows", i, d, e.residual[i])
		}
		e.acc[i] = a
	}
	e.clamped = 0
	u := &Update{ParamCount: e.n, Encoding: e.enc}
	if !e.enc.sparse() {
		return e.dense(u), nil
	}

	indices := e.topK()
	vs := e.enc.valueSize()
	if sparseSize(indices, e.n, vs) >= vs*e.n {
		// A dense message would be no larger: send everything.
		if e.enc == EncodingTopK16 {
			u.Encoding = EncodingDense16
		} else {
			u.Encoding = EncodingDense32
		}
		return e.dense(u), nil
	}
	copy(e.residual, e.acc)
	e.holds = true
	u.Indices = indices
	u.Values = make([]float32, len(indices))
	for j, i := range indices {
		q := e.quantize(e.acc[i])
		u.Values[j] = q
		e.residual[i] = e.acc[i] - float64(q)
	}
	return u, nil
}

// Restore puts an update returned by Encode back into the residual, for when
// it could not be published.
func (e *Encoder) Restore(u *Update) {
	e.alloc()
	e.holds = true
	if u.Encoding.sparse() {
		for j, i := range u.Indices {
			e.residual[i] += float64(u.Values[j])
		}
		return
	}
	for i, v := range u.Values {
		e.residual[i] += float64(v)
	}
}

// quantize rounds a to what the wire will carry, clamped to ±maxAbs, and
// counts a clamp. Rounding never takes the result past maxAbs: a value that
// rounds up beyond it is taken one step towards zero (receivers reject
// |value| > MaxAbsValue, and float32(0.1) > 0.1).
func (e *Encoder) quantize(a float64) float32 {
	if a > e.maxAbs || a < -e.maxAbs {
		a = math.Copysign(e.maxAbs, a)
		e.clamped++
	}
	if e.enc.half() {
		h := float32ToHalf(float32(a))
		if math.Abs(float64(halfToFloat32(h))) > e.maxAbs {
			h-- // the next half towards zero: the magnitude is in the low 15 bits
		}
		return halfToFloat32(h)
	}
	q := float32(a)
	if math.Abs(float64(q)) > e.maxAbs {
		q = math.Nextafter32(q, 0)
	}
	return q
}

// topK returns, in increasing order, the indices of the k entries of acc with
// the largest magnitude, skipping zeros. Ties at the threshold go to the lower
// indices, so the choice is deterministic. O(n) expected.
func (e *Encoder) topK() []uint32 {
	for i, a := range e.acc {
		e.mag[i] = math.Abs(a)
	}
	thr := kthLargest(e.mag, e.k) // permutes e.mag
	out := make([]uint32, 0, e.k)
	atThr := 0
	for _, a := range e.acc {
		if math.Abs(a) > thr {
			atThr++
		}
	}
	atThr = e.k - atThr // entries equal to thr we may take
	for i, a := range e.acc {
		m := math.Abs(a)
		if m == 0 {
			continue
		}
		if m > thr {
			out = append(out, uint32(i))
		} else if m == thr && atThr > 0 {
			out = append(out, uint32(i))
			atThr--
		}
	}
	return out
}

// kthLargest returns the k-th largest value of a (1-based), reordering a.
// Hoare-style quickselect with a median-of-three pivot; deterministic.
func kthLargest(a []float64, k int) float64 {
	lo, hi := 0, len(a)-1
	target := k - 1 // index in descending order
	for lo < hi {
		mid := lo + (hi-lo)/2
		// median of three into a[mid]
		if a[lo] < a[mid] {
			a[lo], a[mid] = a[mid], a[lo]
		}
		if a[mid] < a[hi] {
			a[mid], a[hi] = a[hi], a[mid]
			if a[lo] < a[mid] {
				a[lo], a[mid] = a[mid], a[lo]
			}
		}
		pivot := a[mid]
		i, j := lo, hi
		for i <= j {
			for a[i] > pivot {
				i++
			}
			for a[j] < pivot {
				j--
			}
			if i <= j {
				a[i], a[j] = a[j], a[i]
				i++
				j--
			}
		}
		switch {
		case target <= j:
			hi = j
		case target >= i:
			lo = i
		default:
			return a[target]
		}
	}
	return a[target]
}

// dense fills u with every accumulated value, quantised, and keeps the
// quantisation error as the residual.
func (e *Encoder) dense(u *Update) *Update {
	u.Values = make([]float32, e.n)
	e.holds = false
	for i, a := range e.acc {
		q := e.quantize(a)
		u.Values[i] = q
		e.residual[i] = a - float64(q)
		if e.residual[i] != 0 {
			e.holds = true
		}
	}
	return u
}
