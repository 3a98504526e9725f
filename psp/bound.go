package psp

import (
	"errors"
	"fmt"
	"math"
)

// BoundResult holds the PSP convergence bound of the reference chapter
// ("Convergence") for one set of parameters.
type BoundResult struct {
	A        float64 // a = F(r)^β
	S        float64 // S = (1-a) / (F(r)(1-a) + a - a^(T-r+1))
	Mean     float64 // bound on (1/T) Σ E(γ_t)
	Variance float64 // bound on (1/T) Σ E(γ_t²)
}

// ErrBound is wrapped by Bound's errors.
var ErrBound = errors.New("invalid bound parameters")

// Bound evaluates the bounds on the mean and variance of the update sequence
// lag γ_t under PSP, as functions of the lag CDF value F = F(r), the sample
// size β, the staleness r and the sequence length T:
//
//	a = F^β
//	S = (1-a) / (F(1-a) + a - a^(T-r+1))
//	mean     <= S · ( r(r+1)/2        + a(r+2)/(1-a)²  )
//	variance <  S · ( r(r+1)(2r+1)/6  + a(r²+4)/(1-a)³ )
//
// F must lie in (0, 1): at F = 1 (a = 1) the expressions are 0/0 and the
// bound says nothing. β must be >= 1 (β = 0 is ASP, which the bound does not
// cover), r >= 0 and T > r.
func Bound(F float64, beta, r, T int) (BoundResult, error) {
	switch {
	case !(F > 0 && F < 1):
		return BoundResult{}, fmt.Errorf("%w: F(r)=%v must be in (0, 1)", ErrBound, F)
	case beta < 1:
		return BoundResult{}, fmt.Errorf("%w: β=%d must be >= 1", ErrBound, beta)
	case r < 0 || T <= r:
		return BoundResult{}, fmt.Errorf("%w: need 0 <= r < T, got r=%d T=%d", ErrBound, r, T)
	}
	a := math.Pow(F, float64(beta))
	rf := float64(r)
	s := (1 - a) / (F*(1-a) + a - math.Pow(a, float64(T-r+1)))
	return BoundResult{
		A:        a,
		S:        s,
		Mean:     s * (rf*(rf+1)/2 + a*(rf+2)/((1-a)*(1-a))),
		Variance: s * (rf*(rf+1)*(2*rf+1)/6 + a*(rf*rf+4)/((1-a)*(1-a)*(1-a))),
	}, nil
}
