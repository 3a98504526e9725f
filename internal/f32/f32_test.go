package f32

import (
	"math"
	"testing"
)

func wire(v []float32) []byte { return Append(nil, v) }

func TestBeyond(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	for _, n := range []int{1, 2, 3, 7, 8, 9, 1001} {
		for i := range n {
			for _, x := range []float32{nan, inf, -inf, 1e4 + 1, -2e4} {
				v := make([]float32, n)
				for j := range v {
					v[j] = 0.5
				}
				v[i] = x
				b := wire(v)
				for name, bb := range map[string][]byte{"aligned": b, "unaligned": append([]byte{0}, b...)[1:]} {
					got, val := Beyond(bb, 1e4)
					if got != i || math.Float32bits(val) != math.Float32bits(x) {
						t.Fatalf("%s n %d, value %d = %v: got %d (%v)", name, n, i, x, got, val)
					}
				}
				if got, _ := BeyondValues(v, 1e4); got != i {
					t.Fatalf("values: n %d, value %d = %v: got %d", n, i, x, got)
				}
			}
		}
		ok := make([]float32, n)
		for j := range ok {
			ok[j] = -1e4 // the bound itself is within
		}
		if got, _ := Beyond(wire(ok), 1e4); got != -1 {
			t.Fatalf("n %d: the bound itself refused at %d", n, got)
		}
	}
	if got, _ := Beyond(nil, 1); got != -1 {
		t.Error("an empty vector has a bad value")
	}
}

func TestViewDecodeNorms(t *testing.T) {
	v := []float32{3, -4, 0, 1.5}
	b := wire(v)
	got := make([]float32, len(v))
	Decode(got, b)
	for i := range v {
		if got[i] != v[i] {
			t.Fatalf("decode: %v", got)
		}
	}
	if w, ok := View(b); ok && (len(w) != len(v) || w[1] != -4) {
		t.Fatalf("view: %v", w)
	}
	if Norm(v[:2]) != 5 || Norm(v) != math.Sqrt(27.25) {
		t.Errorf("norm %v %v", Norm(v[:2]), Norm(v))
	}
	if d := Dist(v, make([]float32, 4)); d != Norm(v) {
		t.Errorf("dist %v", d)
	}
	dst := make([]float32, 4)
	if d := CopyDist(dst, v); d != Norm(v) || dst[3] != 1.5 {
		t.Errorf("copydist %v %v", d, dst)
	}
}

func BenchmarkBeyond(b *testing.B) {
	v := make([]float32, 1_000_000)
	raw := wire(v)
	b.SetBytes(int64(len(raw)))
	for b.Loop() {
		if i, _ := Beyond(raw, 1e4); i != -1 {
			b.Fatal(i)
		}
	}
}

func TestScaleAdd(t *testing.T) {
	dst := make([]float32, 3)
	Scale(dst, []float32{1, 2, 3}, 2)
	AddScaled(dst, []float32{1, 1, 1}, -1)
	v := []float32{10, 20, 30}
	AddScaledAndAdd(dst, v, 0.5) // dst = [1 3 5] + [5 10 15]; v += dst
	want := []float32{6, 13, 20}
	for i := range want {
		if dst[i] != want[i] || v[i] != []float32{16, 33, 50}[i] {
			t.Fatalf("dst %v, v %v", dst, v)
		}
	}
}

// BenchmarkPasses times the passes a step makes over a model of 1 M
// values (4 MB): the norm, the distance, and the copy with the distance.
func BenchmarkPasses(b *testing.B) {
	a, c := make([]float32, 1_000_000), make([]float32, 1_000_000)
	for i := range a {
		a[i], c[i] = float32(i%97)*0.01, float32(i%89)*0.01
	}
	b.Run("Norm", func(b *testing.B) {
		b.SetBytes(4 * int64(len(a)))
		for b.Loop() {
			Norm(a)
		}
	})
	b.Run("Dist", func(b *testing.B) {
		b.SetBytes(8 * int64(len(a)))
		for b.Loop() {
			Dist(a, c)
		}
	})
	b.Run("CopyDist", func(b *testing.B) {
		b.SetBytes(8 * int64(len(a)))
		for b.Loop() {
			CopyDist(c, a)
		}
	})
}
