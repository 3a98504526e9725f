//go:build !amd64

package f32

// Without vector loops every kernel is its Go loop (kernels.go).

func vecLen(int) int { return 0 }

func withinVec([]float32, uint32) bool                      { panic("unreachable") }
func checkDistVec(_, _ []float32, _ uint32) (float64, bool) { panic("unreachable") }
func copyDistVec(_, _ []float32) float64                    { panic("unreachable") }
func stepMergeVec(_, _, _ []float32, _, _ float32) float64  { panic("unreachable") }
func scaleVec(_, _ []float32, _ float32)                    { panic("unreachable") }
func axpyVec(_, _ []float32, _ float32)                     { panic("unreachable") }
func sumSqVec([]float32) float64                            { panic("unreachable") }
