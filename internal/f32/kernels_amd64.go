package f32

import "golang.org/x/sys/cpu"

// vector says whether the AVX2 loops run: the CPU has AVX2 and FMA.
var vector = cpu.X86.HasAVX2 && cpu.X86.HasFMA

// vecLen is how many of n values the vector loops take: a multiple of 8
// (a YMM register of float32), or none without them.
func vecLen(n int) int {
	if !vector {
		return 0
	}
	return n &^ 7
}

// The AVX2 loops (kernels_amd64.s); n is a multiple of 8.

//go:noescape
func withinAVX2(v *float32, n int, limit uint32) bool

//go:noescape
func checkDistAVX2(y, r *float32, n int, limit uint32) (d2 float64, ok bool)

//go:noescape
func copyDistAVX2(dst, src *float32, n int) float64

//go:noescape
func stepMergeAVX2(x, r, a *float32, n int, s, w float32) float64

//go:noescape
func scaleAVX2(dst, src *float32, n int, c float32)

//go:noescape
func axpyAVX2(dst, src *float32, n int, c float32)

//go:noescape
func sumSqAVX2(v *float32, n int) float64

func withinVec(v []float32, limit uint32) bool { return withinAVX2(&v[0], len(v), limit) }

func checkDistVec(y, r []float32, limit uint32) (float64, bool) {
	return checkDistAVX2(&y[0], &r[0], len(y), limit)
}

func copyDistVec(dst, src []float32) float64 { return copyDistAVX2(&dst[0], &src[0], len(dst)) }

func stepMergeVec(x, r, a []float32, s, w float32) float64 {
	return stepMergeAVX2(&x[0], &r[0], &a[0], len(x), s, w)
}

func scaleVec(dst, src []float32, c float32) { scaleAVX2(&dst[0], &src[0], len(dst), c) }
func axpyVec(dst, src []float32, c float32)  { axpyAVX2(&dst[0], &src[0], len(dst), c) }
func sumSqVec(v []float32) float64           { return sumSqAVX2(&v[0], len(v)) }
