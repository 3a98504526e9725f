package model

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// smallSet returns a random dataset for model m with n rows.
func smallSet(m Model, n int, rng *rand.Rand) *Dataset {
	ds := &Dataset{Name: "small", Dim: m.InputDim(), X: make([]float64, n*m.InputDim())}
	for i := range ds.X {
		ds.X[i] = rng.NormFloat64()
	}
	if m.Classifier() {
		ds.Classes = m.Outputs()
		ds.Labels = make([]int, n)
		for i := range ds.Labels {
			ds.Labels[i] = rng.IntN(ds.Classes)
		}
	} else {
		ds.Targets = make([]float64, n)
		for i := range ds.Targets {
			ds.Targets[i] = 3 * rng.NormFloat64()
		}
	}
	return ds
}

func TestGradientNumerical(t *testing.T) {
	tests := []struct {
		name           string
		dim, k, hidden int
	}{
		{name: "linreg", dim: 7},
		{name: "logreg", dim: 6, k: 2},
		{name: "logreg", dim: 5, k: 4},
		{name: "mlp:5", dim: 4, k: 3},
		{name: "mlp:8", dim: 6, k: 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := New(tc.name, tc.dim, tc.k)
			if err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(7, uint64(tc.dim)))
			b := smallSet(m, 9, rng)
			p := m.Init(rng)
			for i := range p { // move away from the all-zero start
				p[i] += 0.3 * rng.NormFloat64()
			}
			grad := make([]float64, len(p))
			loss, err := m.LossGrad(p, b, grad)
			if err != nil {
				t.Fatal(err)
			}
			if l2, _ := m.LossGrad(p, b, nil); l2 != loss {
				t.Errorf("loss without gradient %v, with gradient %v", l2, loss)
			}
			const h = 1e-6
			q := append([]float64(nil), p...)
			for i := range p {
				q[i] = p[i] + h
				lp, _ := m.LossGrad(q, b, nil)
				q[i] = p[i] - h
				lm, _ := m.LossGrad(q, b, nil)
				q[i] = p[i]
				num := (lp - lm) / (2 * h)
				if d := math.Abs(num - grad[i]); d > 1e-6*math.Max(1, math.Abs(num)) {
					t.Errorf("param %d: analytic %.9g, numerical %.9g", i, grad[i], num)
				}
			}
		})
	}
}

func TestPredictMatchesLoss(t *testing.T) {
	// For a classifier, the mean −log p_y from Predict must equal LossGrad's loss.
	for _, name := range []string{"logreg", "mlp:6"} {
		m, _ := New(name, 5, 3)
		rng := rand.New(rand.NewPCG(1, 1))
		b := smallSet(m, 11, rng)
		p := m.Init(rng)
		for i := range p {
			p[i] += 0.5 * rng.NormFloat64()
		}
		loss, _ := m.LossGrad(p, b, nil)
		out := make([]float64, 3)
		sum := 0.0
		for i := range b.Len() {
			if err := m.Predict(p, b.Row(i), out); err != nil {
				t.Fatal(err)
			}
			sum -= math.Log(out[b.Labels[i]])
		}
		if got := sum / float64(b.Len()); math.Abs(got-loss) > 1e-12 {
			t.Errorf("%s: mean −log p from Predict %v, LossGrad %v", name, got, loss)
		}
	}
}

func TestNew(t *testing.T) {
	tests := []struct {
		name       string
		dim, k     int
		wantParams int
		wantErr    string
	}{
		{"linreg", 20, 0, 21, ""},
		{"linreg", 20, 1, 21, ""},
		{"logreg", 784, 10, 7850, ""},
		{"mlp", 784, 10, 784*64 + 64 + 64*10 + 10, ""},
		{"mlp:32", 10, 3, 10*32 + 32 + 32*3 + 3, ""},
		{"linreg", 20, 3, 0, "one real output"},
		{"logreg", 784, 1, 0, "at least 2 classes"},
		{"logreg", 0, 10, 0, "positive"},
		{"mlp:x", 10, 3, 0, "bad hidden width"},
		{"mlp:0", 10, 3, 0, "positive"},
		{"logreg", 1 << 30, 1 << 30, 0, "too large"},
		{"svm", 10, 2, 0, "unknown model"},
	}
	for _, tc := range tests {
		m, err := New(tc.name, tc.dim, tc.k)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("New(%q, %d, %d): error %v, want %q", tc.name, tc.dim, tc.k, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("New(%q, %d, %d): %v", tc.name, tc.dim, tc.k, err)
			continue
		}
		if m.NumParams() != tc.wantParams || m.Shape().NumParams() != tc.wantParams || len(m.Init(rand.New(rand.NewPCG(1, 1)))) != tc.wantParams {
			t.Errorf("%s: %d params (shape %v), want %d", tc.name, m.NumParams(), m.Shape(), tc.wantParams)
		}
		if m2, _ := New(m.Name(), tc.dim, tc.k); !m2.Shape().Equal(m.Shape()) {
			t.Errorf("%s: New(Name()) has a different shape", tc.name)
		}
	}
}

func TestLossGradRejectsBadInput(t *testing.T) {
	m, _ := New("logreg", 4, 3)
	rng := rand.New(rand.NewPCG(1, 1))
	good := smallSet(m, 5, rng)
	p := m.Init(nil)
	reg := smallSet(&LinReg{dim: 4}, 5, rng)
	wrongDim := smallSet(&LogReg{dim: 5, classes: 3}, 5, rng)
	tests := []struct {
		name   string
		params []float64
		b      *Dataset
		grad   []float64
	}{
		{"short params", p[:3], good, nil},
		{"short grad", p, good, make([]float64, 2)},
		{"nil batch", p, nil, nil},
		{"empty batch", p, &Dataset{Dim: 4, Classes: 3}, nil},
		{"regression batch", p, reg, nil},
		{"wrong dim", p, wrongDim, nil},
	}
	for _, tc := range tests {
		if _, err := m.LossGrad(tc.params, tc.b, tc.grad); err == nil {
			t.Errorf("%s: no error", tc.name)
		}
	}
	if err := m.Predict(p, make([]float64, 3), make([]float64, 3)); err == nil {
		t.Error("Predict with a short input: no error")
	}
}

func TestPredictBatchMatchesPredict(t *testing.T) {
	for _, name := range []string{"linreg", "logreg", "mlp:6"} {
		k := 3
		if name == "linreg" {
			k = 0
		}
		m, _ := New(name, 5, k)
		rng := rand.New(rand.NewPCG(2, 2))
		b := smallSet(m, 7, rng)
		p := m.Init(rng)
		for i := range p {
			p[i] += 0.5 * rng.NormFloat64()
		}
		all := make([]float64, b.Len()*m.Outputs())
		if err := m.PredictBatch(p, b, all); err != nil {
			t.Fatal(err)
		}
		one := make([]float64, m.Outputs())
		for i := range b.Len() {
			m.Predict(p, b.Row(i), one)
			for c, v := range one {
				if math.Abs(v-all[i*m.Outputs()+c]) > 1e-12 {
					t.Fatalf("%s: row %d output %d: Predict %v, PredictBatch %v", name, i, c, v, all[i*m.Outputs()+c])
				}
			}
		}
		if err := m.PredictBatch(p, b, all[1:]); err == nil {
			t.Errorf("%s: short output: no error", name)
		}
	}
}
