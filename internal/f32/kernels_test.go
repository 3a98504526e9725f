package f32

import (
	"math"
	"math/rand/v2"
	"testing"
)

// The vector loops against the Go loops that define them, on every length
// up to a few vectors (the tails), with a bad value at every place.

func randVec(r *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64())
	}
	return v
}

func close64(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }

func sameBits(a, b []float32) bool {
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return len(a) == len(b)
}

func TestKernelsMatchGo(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	lim := Limit(3)
	for n := 0; n <= 70; n++ {
		x, y, a := randVec(r, n), randVec(r, n), randVec(r, n)

		if got, want := Within(x, lim), withinGo(x, lim); got != want {
			t.Fatalf("n %d: Within %v, want %v", n, got, want)
		}
		d2, ok := CheckDist(x, y, lim)
		wd2, wok := checkDistGo(x, y, lim)
		if !close64(d2, wd2) || ok != wok {
			t.Fatalf("n %d: CheckDist %v %v, want %v %v", n, d2, ok, wd2, wok)
		}
		if got, want := SumSq(x), SumSq(x[:0])+sumGo(x); !close64(got, want) {
			t.Fatalf("n %d: SumSq %v, want %v", n, got, want)
		}

		dst, dst2 := append([]float32(nil), y...), append([]float32(nil), y...)
		if got, want := CopyDist2(dst, x), copyDistGo(dst2, x); !close64(got, want) || !sameBits(dst, dst2) {
			t.Fatalf("n %d: CopyDist2 %v, want %v", n, got, want)
		}

		x1, r1 := append([]float32(nil), x...), append([]float32(nil), y...)
		x2, r2 := append([]float32(nil), x...), append([]float32(nil), y...)
		got, want := StepMerge(x1, r1, a, 1.5, 0.25), stepMergeGo(x2, r2, a, 1.5, 0.25)
		if !close64(got, want) || !sameBits(x1, x2) || !sameBits(r1, r2) {
			t.Fatalf("n %d: StepMerge %v, want %v (x %v, want %v)", n, got, want, x1, x2)
		}

		s1, s2 := make([]float32, n), make([]float32, n)
		ScaleTo(s1, x, 0.3)
		for i := range x {
			s2[i] = 0.3 * x[i]
		}
		if !sameBits(s1, s2) {
			t.Fatalf("n %d: ScaleTo %v, want %v", n, s1, s2)
		}
		Axpy(s1, y, -2)
		for i := range y {
			s2[i] = float32(math.FMA(float64(-2), float64(y[i]), float64(s2[i])))
		}
		for i := range s1 { // FMA rounds once; the Go loop twice
			if math.Abs(float64(s1[i]-s2[i])) > 1e-6*math.Max(1, math.Abs(float64(s2[i]))) {
				t.Fatalf("n %d: Axpy[%d] %v, want %v", n, i, s1[i], s2[i])
			}
		}
	}
}

func sumGo(v []float32) float64 {
	var s float64
	for _, x := range v {
		s += float64(x) * float64(x)
	}
	return s
}

func TestKernelsFindBadValues(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(-1))
	lim := Limit(1e4)
	for _, n := range []int{1, 7, 8, 9, 16, 33, 1000} {
		for i := range n {
			for _, bad := range []float32{nan, inf, 1e4 + 1} {
				v := make([]float32, n)
				v[i] = bad
				if Within(v, lim) {
					t.Fatalf("n %d: %v at %d is within", n, bad, i)
				}
				if j, x := First(v, lim); j != i || math.Float32bits(x) != math.Float32bits(bad) {
					t.Fatalf("n %d: First %d %v, want %d %v", n, j, x, i, bad)
				}
				if _, ok := CheckDist(v, make([]float32, n), lim); ok {
					t.Fatalf("n %d: CheckDist passed %v at %d", n, bad, i)
				}
			}
		}
		edge := make([]float32, n)
		for j := range edge {
			edge[j] = -1e4
		}
		if !Within(edge, lim) {
			t.Fatalf("n %d: the bound itself refused", n)
		}
	}
}

// With the vector loops off, the exported kernels are the Go loops.
func TestKernelsWithoutVector(t *testing.T) {
	saved := vector
	t.Cleanup(func() { vector = saved })
	vector = false
	r := rand.New(rand.NewPCG(3, 4))
	x, y, a := randVec(r, 100), randVec(r, 100), randVec(r, 100)
	x2, y2 := append([]float32(nil), x...), append([]float32(nil), y...)
	if got, want := StepMerge(x, y, a, 2, 0.5), stepMergeGo(x2, y2, a, 2, 0.5); got != want || !sameBits(x, x2) {
		t.Fatalf("StepMerge %v, want %v", got, want)
	}
}

// Benchmarks of one pass over a 10 M-value model (40 MB): compare each
// with BenchmarkCopy, the pass a memory copy makes.
const benchN = 10_000_000

func benchVecs() (x, y, a []float32) {
	r := rand.New(rand.NewPCG(5, 6))
	return randVec(r, benchN), randVec(r, benchN), randVec(r, benchN)
}

func BenchmarkCopy(b *testing.B) {
	x, y, _ := benchVecs()
	b.SetBytes(4 * benchN)
	for b.Loop() {
		copy(x, y)
	}
}

func BenchmarkWithin(b *testing.B) {
	x, _, _ := benchVecs()
	b.SetBytes(4 * benchN)
	for b.Loop() {
		Within(x, Limit(1e6))
	}
}

func BenchmarkCheckDist(b *testing.B) {
	x, y, _ := benchVecs()
	b.SetBytes(4 * benchN)
	for b.Loop() {
		CheckDist(x, y, Limit(1e6))
	}
}

func BenchmarkCopyDist2(b *testing.B) {
	x, y, _ := benchVecs()
	b.SetBytes(4 * benchN)
	for b.Loop() {
		CopyDist2(x, y)
	}
}

func BenchmarkStepMerge(b *testing.B) {
	x, y, a := benchVecs()
	b.SetBytes(4 * benchN)
	for b.Loop() {
		StepMerge(x, y, a, 0, 0)
	}
}

func BenchmarkAxpy(b *testing.B) {
	x, y, _ := benchVecs()
	b.SetBytes(4 * benchN)
	for b.Loop() {
		Axpy(x, y, 1e-9)
	}
}
