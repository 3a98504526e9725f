// Package ring keeps the last n values of a series: recent waits, round
// trips, norms. Its buffer grows as values come, so a ring that records
// few (a short run, a testnet of thousands of nodes) holds few. It is not
// safe for concurrent use: its owner locks it.
package ring

// Ring keeps the last Max values added.
type Ring struct {
	buf  []float64
	max  int
	next int // where the next value goes, once the buffer is full
}

// New returns a ring of the last n values.
func New(n int) Ring { return Ring{max: n} }

// Add records v, forgetting the oldest value if the ring is full.
func (r *Ring) Add(v float64) {
	if len(r.buf) < r.max {
		r.buf = append(r.buf, v)
		return
	}
	r.buf[r.next] = v
	r.next = (r.next + 1) % r.max
}

// Values returns the values kept, oldest first, in a new slice.
func (r *Ring) Values() []float64 {
	out := make([]float64, 0, len(r.buf))
	out = append(out, r.buf[r.next:]...)
	return append(out, r.buf[:r.next]...)
}
