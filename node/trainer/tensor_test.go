package trainer

import (
	"fmt"
	"strings"
	"testing"
)

func BenchmarkBadValue(b *testing.B) {
	v := f32bytes(fill(1_000_000, 0.5))
	for b.Loop() {
		if badValue(v, 1e4) != "" {
			b.Fatal()
		}
	}
}

func BenchmarkCopy(b *testing.B) {
	v := f32bytes(fill(1_000_000, 0.5))
	d := make([]byte, len(v))
	for b.Loop() {
		copy(d, v)
	}
}

func TestBadValue(t *testing.T) {
	for _, n := range []int{1, 2, 3, 7, 8, 9, 1001} {
		for i := range n {
			for _, x := range []float32{nanF32(), float32(inf()), -float32(inf()), 1e4 + 1, -2e4} {
				v := fill(n, 0.5)
				v[i] = x
				b := f32bytes(v)
				if got := badValue(b, 1e4); got == "" || !strings.Contains(got, fmt.Sprintf("value %d is", i)) {
					t.Fatalf("n %d, value %d = %v: %q", n, i, x, got)
				}
				// Unaligned too.
				u := append([]byte{0}, b...)[1:]
				if got := badValue(u, 1e4); got == "" {
					t.Fatalf("unaligned: n %d, value %d = %v missed", n, i, x)
				}
			}
			if got := badValue(f32bytes(fill(n, 1e4)), 1e4); got != "" {
				t.Fatalf("the bound itself refused: %q", got)
			}
		}
	}
}

func nanF32() float32 { return float32(nanF()) }
func inf() float64    { return 1 / zero() }
func zero() float64   { return 0 }
