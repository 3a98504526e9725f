package model

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"
)

func newRNG(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 0x5eed)) }

// embeddedOnce loads the embedded MNIST split once for all tests (several
// seconds under the race detector); tests must not modify it.
var embeddedOnce = sync.OnceValues(EmbeddedMNIST)

// loadMNIST returns the embedded MNIST split.
func loadMNIST(tb testing.TB) Data {
	tb.Helper()
	d, err := embeddedOnce()
	if err != nil {
		tb.Fatal(err)
	}
	return d
}

func mnistTrainer(tb testing.TB, d Data) *SGD {
	tb.Helper()
	m, err := New("logreg", d.Train.Dim, d.Train.Classes)
	if err != nil {
		tb.Fatal(err)
	}
	tr, err := NewSGD(m, d.Train, m.Init(nil), DefaultSGDConfig())
	if err != nil {
		tb.Fatal(err)
	}
	return tr
}

func syntheticTrainer(t *testing.T, name string, regression bool) (*SGD, Data) {
	t.Helper()
	d, err := Synthetic(DefaultSyntheticConfig(regression))
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(name, d.Train.Dim, d.Train.Classes)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := NewSGD(m, d.Train, m.Init(newRNG(1)), DefaultSGDConfig())
	if err != nil {
		t.Fatal(err)
	}
	return tr, d
}

func TestApplyRejectsBadUpdates(t *testing.T) {
	tr, _ := syntheticTrainer(t, "logreg", false)
	if _, _, err := tr.Step(newRNG(1)); err != nil {
		t.Fatal(err)
	}
	n := tr.Model().NumParams()
	withAt := func(i int, v float64) []float64 {
		d := make([]float64, n)
		d[i] = v
		return d
	}
	tests := []struct {
		name  string
		delta []float64
		want  error
	}{
		{"nil", nil, ErrLength},
		{"short", make([]float64, n-1), ErrLength},
		{"long", make([]float64, n+1), ErrLength},
		{"NaN first", withAt(0, math.NaN()), ErrNotFinite},
		{"NaN last", withAt(n-1, math.NaN()), ErrNotFinite},
		{"+Inf", withAt(n/2, math.Inf(1)), ErrNotFinite},
		{"-Inf", withAt(3, math.Inf(-1)), ErrNotFinite},
	}
	before := tr.Params()
	for _, tc := range tests {
		for op, f := range map[string]func([]float64) error{"Apply": tr.Apply, "SetParams": tr.SetParams} {
			err := f(tc.delta)
			if !errors.Is(err, tc.want) {
				t.Errorf("%s(%s): error %v, want %v", op, tc.name, err, tc.want)
			}
			if !slices.Equal(tr.Params(), before) {
				t.Fatalf("%s(%s) changed the parameters", op, tc.name)
			}
		}
	}
	if tr.Applied() != 0 {
		t.Errorf("Applied = %d after rejections only", tr.Applied())
	}
}

func TestStepAndApplyAreAdditive(t *testing.T) {
	tr, _ := syntheticTrainer(t, "logreg", false)
	p0 := tr.Params()
	delta, _, err := tr.Step(newRNG(2))
	if err != nil {
		t.Fatal(err)
	}
	p1 := tr.Params()
	for i := range p0 {
		if p1[i] != p0[i]+delta[i] {
			t.Fatalf("param %d: %v after step, want old %v + delta %v", i, p1[i], p0[i], delta[i])
		}
	}
	other := make([]float64, len(p0))
	for i := range other {
		other[i] = float64(i%7) * 1e-3
	}
	if err := tr.Apply(other); err != nil {
		t.Fatal(err)
	}
	for i, v := range tr.Params() {
		if v != p1[i]+other[i] {
			t.Fatalf("param %d: %v after apply, want %v", i, v, p1[i]+other[i])
		}
	}
	if tr.Steps() != 1 || tr.Applied() != 1 {
		t.Errorf("Steps %d Applied %d, want 1 and 1", tr.Steps(), tr.Applied())
	}
}

// SetSteps moves the learning-rate schedule: a trainer set to step 1000
// takes, on the same batch from the same parameters, the step of LR(1000),
// not LR0; and Steps counts on from there.
func TestSetStepsMovesTheSchedule(t *testing.T) {
	fresh, _ := syntheticTrainer(t, "logreg", false)
	resumed, _ := syntheticTrainer(t, "logreg", false)
	resumed.SetSteps(1000)
	d0, _, err := fresh.Step(newRNG(3))
	if err != nil {
		t.Fatal(err)
	}
	d1, _, err := resumed.Step(newRNG(3))
	if err != nil {
		t.Fatal(err)
	}
	cfg := resumed.Config()
	want := cfg.LR(1000) / cfg.LR(0)
	for i := range d0 {
		if d0[i] == 0 {
			continue
		}
		if got := d1[i] / d0[i]; math.Abs(got-want) > 1e-9 {
			t.Fatalf("element %d: update ratio %v, want LR(1000)/LR(0) = %v", i, got, want)
		}
	}
	if got := resumed.Steps(); got != 1001 {
		t.Errorf("Steps = %d after SetSteps(1000) and one step, want 1001", got)
	}
	resumed.SetSteps(-5)
	if got := resumed.Steps(); got != 0 {
		t.Errorf("Steps = %d after SetSteps(-5), want 0", got)
	}
}

func TestStepDeterministic(t *testing.T) {
	run := func() []float64 {
		tr, _ := syntheticTrainer(t, "mlp", false)
		rng := newRNG(9)
		for range 300 { // more than one epoch of the 8000 examples
			if _, _, err := tr.Step(rng); err != nil {
				t.Fatal(err)
			}
		}
		return tr.Params()
	}
	if !slices.Equal(run(), run()) {
		t.Error("same seeds, different parameters")
	}
}

func TestStepDivergenceIsAnError(t *testing.T) {
	d, _ := Synthetic(DefaultSyntheticConfig(true))
	m, _ := New("linreg", d.Train.Dim, 0)
	tr, err := NewSGD(m, d.Train, m.Init(nil), SGDConfig{BatchSize: 8, LR0: 50})
	if err != nil {
		t.Fatal(err)
	}
	rng := newRNG(1)
	for range 1000 {
		if _, _, err = tr.Step(rng); err != nil {
			break
		}
	}
	if !errors.Is(err, ErrNotFinite) {
		t.Fatalf("error %v, want ErrNotFinite", err)
	}
	if firstNonFinite(tr.Params()) >= 0 {
		t.Error("a diverging step left non-finite parameters")
	}
}

func TestNewSGDErrors(t *testing.T) {
	d, _ := Synthetic(DefaultSyntheticConfig(false))
	m, _ := New("logreg", d.Train.Dim, d.Train.Classes)
	good := DefaultSGDConfig()
	p := m.Init(nil)
	lin, _ := New("linreg", d.Train.Dim, 0)
	tests := []struct {
		name   string
		m      Model
		ds     *Dataset
		params []float64
		cfg    SGDConfig
	}{
		{"batch 0", m, d.Train, p, SGDConfig{LR0: 1}},
		{"lr 0", m, d.Train, p, SGDConfig{BatchSize: 1}},
		{"lr NaN", m, d.Train, p, SGDConfig{BatchSize: 1, LR0: math.NaN()}},
		{"decay -1", m, d.Train, p, SGDConfig{BatchSize: 1, LR0: 1, Decay: -1}},
		{"nil shard", m, nil, p, good},
		{"empty shard", m, &Dataset{Dim: d.Train.Dim, Classes: 4, Labels: []int{}}, p, good},
		{"regression model", lin, d.Train, lin.Init(nil), good},
		{"short params", m, d.Train, p[1:], good},
		{"NaN params", m, d.Train, append([]float64{math.NaN()}, p[1:]...), good},
	}
	for _, tc := range tests {
		if _, err := NewSGD(tc.m, tc.ds, tc.params, tc.cfg); err == nil {
			t.Errorf("%s: no error", tc.name)
		}
	}
}

func TestConcurrentStepApplyEvaluate(t *testing.T) {
	tr, d := syntheticTrainer(t, "logreg", false)
	var wg sync.WaitGroup
	wg.Add(3)
	go func() {
		defer wg.Done()
		rng := newRNG(1)
		for range 200 {
			if _, _, err := tr.Step(rng); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	go func() {
		defer wg.Done()
		delta := make([]float64, tr.Model().NumParams())
		for range 500 {
			if err := tr.Apply(delta); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	go func() {
		defer wg.Done()
		for range 5 {
			if _, err := tr.Evaluate(d.Test); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	wg.Wait()
	if tr.Steps() != 200 || tr.Applied() != 500 {
		t.Errorf("Steps %d Applied %d, want 200 and 500", tr.Steps(), tr.Applied())
	}
}

func TestTrainMNISTLogreg(t *testing.T) {
	d := loadMNIST(t)
	tr := mnistTrainer(t, d)
	start := time.Now()
	rng := newRNG(1)
	const steps = 2000
	for range steps {
		if _, _, err := tr.Step(rng); err != nil {
			t.Fatal(err)
		}
	}
	met, err := tr.Evaluate(d.Test)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("logreg on MNIST, %d steps of %+v in %v: held-out accuracy %.4f, loss %.4f (%d images)",
		steps, tr.Config(), time.Since(start).Round(time.Millisecond), met.Accuracy, met.Loss, met.N)
	if met.Accuracy < 0.90 || met.N != 2000 {
		t.Errorf("held-out accuracy %.4f on %d images, want ≥ 0.90 on 2000", met.Accuracy, met.N)
	}
	if !math.IsNaN(met.R2) {
		t.Errorf("R2 of a classifier = %v, want NaN", met.R2)
	}
}

func TestTrainSynthetic(t *testing.T) {
	tests := []struct {
		model      string
		regression bool
		steps      int
		check      func(Metrics) bool
		want       string
	}{
		// Noise 0.1 makes the best mean loss 0.005 and the best R2 about 0.99.
		{"linreg", true, 1000, func(m Metrics) bool { return m.Loss < 0.01 && m.R2 > 0.98 && math.IsNaN(m.Accuracy) }, "loss < 0.01, R2 > 0.98"},
		{"logreg", false, 1000, func(m Metrics) bool { return m.Accuracy > 0.9 }, "accuracy > 0.9"},
		{"mlp", false, 1000, func(m Metrics) bool { return m.Accuracy > 0.9 }, "accuracy > 0.9"},
	}
	for _, tc := range tests {
		t.Run(tc.model, func(t *testing.T) {
			tr, d := syntheticTrainer(t, tc.model, tc.regression)
			before, _ := tr.Evaluate(d.Test)
			rng := newRNG(3)
			for range tc.steps {
				if _, _, err := tr.Step(rng); err != nil {
					t.Fatal(err)
				}
			}
			after, err := tr.Evaluate(d.Test)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: held-out %+v → %+v", tc.model, before, after)
			if !tc.check(after) || after.Loss >= before.Loss {
				t.Errorf("held-out %+v, want %s and a lower loss than %v", after, tc.want, before.Loss)
			}
		})
	}
}

func TestTrainersExchangingUpdates(t *testing.T) {
	// Four trainers on disjoint shards, each adding the others' updates
	// (the node's read-my-writes rule), converge like one trainer.
	d, _ := Synthetic(DefaultSyntheticConfig(true))
	m, _ := New("linreg", d.Train.Dim, 0)
	const n = 4
	var trs []*SGD
	for i := range n {
		s, err := ShardOf(d.Train, i, n)
		if err != nil {
			t.Fatal(err)
		}
		cfg := DefaultSGDConfig()
		cfg.LR0 /= n
		tr, err := NewSGD(m, s, m.Init(nil), cfg)
		if err != nil {
			t.Fatal(err)
		}
		trs = append(trs, tr)
	}
	rng := newRNG(4)
	for range 300 {
		for i, tr := range trs {
			delta, _, err := tr.Step(rng)
			if err != nil {
				t.Fatal(err)
			}
			for j, o := range trs {
				if j != i {
					if err := o.Apply(delta); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
	}
	p0 := trs[0].Params()
	for _, tr := range trs[1:] {
		for k, v := range tr.Params() {
			if math.Abs(v-p0[k]) > 1e-9 {
				t.Fatalf("trainers disagree on param %d: %v vs %v", k, v, p0[k])
			}
		}
	}
	met, _ := trs[0].Evaluate(d.Test)
	if met.Loss > 0.01 {
		t.Errorf("held-out loss %v after exchanging updates, want < 0.01", met.Loss)
	}
}

func TestEvaluateErrors(t *testing.T) {
	d, _ := Synthetic(DefaultSyntheticConfig(false))
	m, _ := New("logreg", d.Train.Dim, d.Train.Classes)
	if _, err := Evaluate(m, m.Init(nil)[1:], d.Test); err == nil {
		t.Error("short params: no error")
	}
	if _, err := Evaluate(m, m.Init(nil), &Dataset{Dim: d.Train.Dim, Classes: d.Train.Classes}); err == nil {
		t.Error("empty dataset: no error")
	}
}

func TestLRSchedule(t *testing.T) {
	c := SGDConfig{BatchSize: 1, LR0: 0.5, Decay: 0.01}
	for _, tc := range []struct {
		t    int
		want float64
	}{{0, 0.5}, {100, 0.25}, {300, 0.125}} {
		if got := c.LR(tc.t); math.Abs(got-tc.want) > 1e-15 {
			t.Errorf("LR(%d) = %v, want %v", tc.t, got, tc.want)
		}
	}
}

func BenchmarkApplyMNISTLogreg(b *testing.B) {
	m, _ := New("logreg", 784, 10)
	d := &Dataset{Name: "one", Dim: 784, Classes: 10, X: make([]float64, 784), Labels: []int{3}}
	tr, err := NewSGD(m, d, m.Init(nil), DefaultSGDConfig())
	if err != nil {
		b.Fatal(err)
	}
	delta := make([]float64, m.NumParams())
	for i := range delta {
		delta[i] = 1e-9 * float64(i%13)
	}
	b.SetBytes(int64(4 * len(delta))) // the float32 wire size of the update
	b.ReportAllocs()
	for b.Loop() {
		if err := tr.Apply(delta); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkStepMNISTLogreg(b *testing.B) {
	tr := mnistTrainer(b, loadMNIST(b))
	rng := newRNG(1)
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := tr.Step(rng); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkStepMNISTMLP(b *testing.B) {
	d := loadMNIST(b)
	m, _ := New("mlp", d.Train.Dim, d.Train.Classes)
	tr, err := NewSGD(m, d.Train, m.Init(newRNG(1)), DefaultSGDConfig())
	if err != nil {
		b.Fatal(err)
	}
	rng := newRNG(1)
	for b.Loop() {
		if _, _, err := tr.Step(rng); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEvaluateMNISTLogreg(b *testing.B) {
	d := loadMNIST(b)
	tr := mnistTrainer(b, d)
	for b.Loop() {
		if _, err := tr.Evaluate(d.Test); err != nil {
			b.Fatal(err)
		}
	}
}

func TestEvaluateMatchesLossGradAndPredict(t *testing.T) {
	for _, tc := range []struct {
		name       string
		regression bool
	}{{"linreg", true}, {"logreg", false}, {"mlp", false}} {
		tr, d := syntheticTrainer(t, tc.name, tc.regression)
		rng := newRNG(5)
		for range 50 {
			tr.Step(rng)
		}
		m, p := tr.Model(), tr.Params()
		met, err := Evaluate(m, p, d.Test)
		if err != nil {
			t.Fatal(err)
		}
		loss, _ := m.LossGrad(p, d.Test, nil)
		if math.Abs(met.Loss-loss) > 1e-9*loss {
			t.Errorf("%s: Evaluate loss %v, LossGrad %v", tc.name, met.Loss, loss)
		}
		if tc.regression {
			continue
		}
		out := make([]float64, m.Outputs())
		correct := 0
		for i := range d.Test.Len() {
			m.Predict(p, d.Test.Row(i), out)
			if argmax(out) == d.Test.Labels[i] {
				correct++
			}
		}
		if want := float64(correct) / float64(d.Test.Len()); met.Accuracy != want {
			t.Errorf("%s: Evaluate accuracy %v, Predict gives %v", tc.name, met.Accuracy, want)
		}
	}
}

func TestFirstNonFinite(t *testing.T) {
	big := []float64{math.MaxFloat64, math.MaxFloat64, 1} // sum overflows, all finite
	tests := []struct {
		v    []float64
		want int
	}{
		{nil, -1},
		{[]float64{1, 2, 3}, -1},
		{big, -1},
		{[]float64{1, math.NaN()}, 1},
		{[]float64{math.Inf(1), 0}, 0},
		{[]float64{math.MaxFloat64, math.Inf(-1)}, 1},
		{[]float64{math.Inf(1), math.Inf(-1)}, 0},
	}
	for _, tc := range tests {
		if got := firstNonFinite(tc.v); got != tc.want {
			t.Errorf("firstNonFinite(%v) = %d, want %d", tc.v, got, tc.want)
		}
	}
}

func TestSetLRScale(t *testing.T) {
	a, b := twoTrainers(t)
	b.SetLRScale(0.25)
	b.SetLRScale(math.NaN()) // ignored
	da, _, _ := a.Step(rand.New(rand.NewPCG(1, 2)))
	db, _, _ := b.Step(rand.New(rand.NewPCG(1, 2)))
	for i := range da {
		if math.Abs(db[i]-0.25*da[i]) > 1e-12 {
			t.Fatalf("element %d: scaled delta %v, want a quarter of %v", i, db[i], da[i])
		}
	}
}

// Compute leaves the parameters and the schedule as they were; Commit
// then makes the two halves one Step.
func TestComputeThenCommitIsStep(t *testing.T) {
	a, b := twoTrainers(t)
	before := b.Params()
	da, _, _ := a.Step(rand.New(rand.NewPCG(1, 2)))
	db, _, err := b.Compute(rand.New(rand.NewPCG(1, 2)))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(b.Params(), before) || b.Steps() != 0 {
		t.Fatalf("Compute changed the trainer: steps %d", b.Steps())
	}
	b.Commit(db)
	if !slices.Equal(da, db) || !slices.Equal(a.Params(), b.Params()) || b.Steps() != 1 {
		t.Errorf("Compute+Commit differs from Step: steps %d", b.Steps())
	}
}

// twoTrainers are two identical linreg trainers on the synthetic data.
func twoTrainers(t *testing.T) (*SGD, *SGD) {
	t.Helper()
	data, err := Synthetic(DefaultSyntheticConfig(true))
	if err != nil {
		t.Fatal(err)
	}
	m, _ := New("linreg", data.Train.Dim, 0)
	mk := func() *SGD {
		tr, err := NewSGD(m, data.Train, m.Init(nil), DefaultSGDConfig())
		if err != nil {
			t.Fatal(err)
		}
		return tr
	}
	return mk(), mk()
}
