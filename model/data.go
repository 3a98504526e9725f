package model

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"

	"gonum.org/v1/gonum/floats"
)

// Dataset is a set of examples: X holds Len() rows of Dim features each,
// row-major. A classification set (Classes ≥ 2) has one label in
// [0, Classes) per row in Labels and no Targets; a regression set
// (Classes == 0) has one real target per row in Targets and no Labels.
type Dataset struct {
	Name    string
	Dim     int
	Classes int
	X       []float64
	Labels  []int
	Targets []float64
}

// Len is the number of examples.
func (d *Dataset) Len() int {
	if d == nil || d.Dim <= 0 {
		return 0
	}
	return len(d.X) / d.Dim
}

// Row returns example i's features (a view, not a copy).
func (d *Dataset) Row(i int) []float64 { return d.X[i*d.Dim : (i+1)*d.Dim] }

// Validate checks that the dataset is internally consistent: lengths agree,
// labels are in range and every feature and target is finite.
func (d *Dataset) Validate() error {
	if d == nil {
		return fmt.Errorf("model: nil dataset")
	}
	if d.Dim <= 0 {
		return fmt.Errorf("model: dataset %q: dimension %d, want > 0", d.Name, d.Dim)
	}
	if len(d.X)%d.Dim != 0 {
		return fmt.Errorf("model: dataset %q: %d features is not a multiple of dimension %d", d.Name, len(d.X), d.Dim)
	}
	n := d.Len()
	switch {
	case d.Classes >= 2:
		if len(d.Labels) != n || d.Targets != nil {
			return fmt.Errorf("model: dataset %q: %d rows but %d labels and %d targets (want %d labels, no targets)",
				d.Name, n, len(d.Labels), len(d.Targets), n)
		}
		for i, y := range d.Labels {
			if y < 0 || y >= d.Classes {
				return fmt.Errorf("model: dataset %q: label %d of row %d outside [0,%d)", d.Name, y, i, d.Classes)
			}
		}
	case d.Classes == 0:
		if len(d.Targets) != n || d.Labels != nil {
			return fmt.Errorf("model: dataset %q: %d rows but %d targets and %d labels (want %d targets, no labels)",
				d.Name, n, len(d.Targets), len(d.Labels), n)
		}
		if i := firstNonFinite(d.Targets); i >= 0 {
			return fmt.Errorf("model: dataset %q: target %d: %w", d.Name, i, ErrNotFinite)
		}
	default:
		return fmt.Errorf("model: dataset %q: %d classes, want 0 (regression) or ≥ 2", d.Name, d.Classes)
	}
	if i := firstNonFinite(d.X); i >= 0 {
		return fmt.Errorf("model: dataset %q: feature %d of row %d: %w", d.Name, i%d.Dim, i/d.Dim, ErrNotFinite)
	}
	return nil
}

// compatible reports whether m can train on d (cheap checks only).
func (d *Dataset) compatible(m Model) error {
	if d == nil {
		return fmt.Errorf("model: %s: nil dataset", m.Name())
	}
	if d.Dim != m.InputDim() {
		return fmt.Errorf("model: %s: dataset %q has dimension %d, model wants %d", m.Name(), d.Name, d.Dim, m.InputDim())
	}
	if len(d.X) != d.Len()*d.Dim {
		return fmt.Errorf("model: dataset %q: %d features is not a multiple of dimension %d", d.Name, len(d.X), d.Dim)
	}
	if m.Classifier() {
		if d.Classes != m.Outputs() || len(d.Labels) != d.Len() {
			return fmt.Errorf("model: %s: dataset %q has %d classes and %d labels for %d rows, model wants %d classes",
				m.Name(), d.Name, d.Classes, len(d.Labels), d.Len(), m.Outputs())
		}
		return nil
	}
	if d.Classes != 0 || len(d.Targets) != d.Len() {
		return fmt.Errorf("model: %s: dataset %q is not a regression set (%d classes, %d targets for %d rows)",
			m.Name(), d.Name, d.Classes, len(d.Targets), d.Len())
	}
	return nil
}

// Subset returns a new dataset holding copies of the rows idx, in that
// order. Indices must be in [0, Len()).
func (d *Dataset) Subset(idx []int) *Dataset {
	s := &Dataset{Name: d.Name, Dim: d.Dim, Classes: d.Classes, X: make([]float64, 0, len(idx)*d.Dim)}
	if d.Labels != nil {
		s.Labels = make([]int, 0, len(idx))
	}
	if d.Targets != nil {
		s.Targets = make([]float64, 0, len(idx))
	}
	for _, i := range idx {
		s.X = append(s.X, d.Row(i)...)
		if d.Labels != nil {
			s.Labels = append(s.Labels, d.Labels[i])
		}
		if d.Targets != nil {
			s.Targets = append(s.Targets, d.Targets[i])
		}
	}
	return s
}

// gather copies the rows idx of d into b, reusing b's storage.
func (d *Dataset) gather(idx []int, b *Dataset) {
	b.Name, b.Dim, b.Classes = d.Name, d.Dim, d.Classes
	b.X = b.X[:0]
	b.Labels = b.Labels[:0]
	b.Targets = b.Targets[:0]
	for _, i := range idx {
		b.X = append(b.X, d.Row(i)...)
		if d.Labels != nil {
			b.Labels = append(b.Labels, d.Labels[i])
		}
		if d.Targets != nil {
			b.Targets = append(b.Targets, d.Targets[i])
		}
	}
	if d.Labels == nil {
		b.Labels = nil
	}
	if d.Targets == nil {
		b.Targets = nil
	}
}

// Data is a training set and its held-out evaluation set.
type Data struct {
	Train *Dataset
	Test  *Dataset
}

// SyntheticConfig describes a synthetic task. The same config always yields
// the same data, bit for bit, on every machine: every node of a job that
// uses synthetic data must use the same config (and so the same Seed).
type SyntheticConfig struct {
	// Regression selects the linear-regression task (for "linreg");
	// otherwise the classification task (for "logreg" and "mlp").
	Regression bool
	// Seed determines the true weights or class means and every example.
	Seed uint64
	// Train and Test are the numbers of training and held-out examples.
	Train, Test int
	// Dim is the number of features.
	Dim int
	// Classes is the number of classes of the classification task.
	Classes int
	// Noise is the standard deviation of the Gaussian noise added to each
	// regression target.
	Noise float64
	// Separation is the expected distance between two class means of the
	// classification task, in units of the within-class standard deviation.
	Separation float64
}

// DefaultSyntheticConfig is the embedded default task: 8000 training and
// 2000 held-out examples of 20 features, 4 classes, seed 1.
func DefaultSyntheticConfig(regression bool) SyntheticConfig {
	return SyntheticConfig{
		Regression: regression,
		Seed:       1,
		Train:      8000,
		Test:       2000,
		Dim:        20,
		Classes:    4,
		Noise:      0.1,
		Separation: 4,
	}
}

// Synthetic generates a task deterministically from cfg.
//
// Regression: features x ~ N(0, I); target y = w·x + b + Noise·ε with
// w ~ N(0, I/Dim), b ~ N(0, 1) and ε ~ N(0, 1), all drawn from Seed. The best
// possible mean loss ½E[(y−ŷ)²] is Noise²/2.
//
// Classification: K class means μ_k ~ N(0, Separation²/(2·Dim)·I) (so two
// means are about Separation apart), labels uniform, x = μ_y + N(0, I).
// The classes overlap a little, so a linear model reaches high but not
// perfect accuracy.
func Synthetic(cfg SyntheticConfig) (Data, error) {
	if cfg.Dim < 1 || cfg.Train < 1 || cfg.Test < 1 {
		return Data{}, fmt.Errorf("model: synthetic: dim, train and test must be positive, got %d, %d, %d", cfg.Dim, cfg.Train, cfg.Test)
	}
	if err := checkDims("synthetic", cfg.Train+cfg.Test, cfg.Dim); err != nil {
		return Data{}, err
	}
	if !cfg.Regression && cfg.Classes < 2 {
		return Data{}, fmt.Errorf("model: synthetic: classification needs at least 2 classes, got %d", cfg.Classes)
	}
	if math.IsNaN(cfg.Noise) || math.IsInf(cfg.Noise, 0) || math.IsNaN(cfg.Separation) || math.IsInf(cfg.Separation, 0) {
		return Data{}, fmt.Errorf("model: synthetic: noise and separation: %w", ErrNotFinite)
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x73796e7468657469)) // "synthetic"
	n := cfg.Train + cfg.Test
	all := &Dataset{Dim: cfg.Dim, X: make([]float64, n*cfg.Dim)}
	for i := range all.X {
		all.X[i] = rng.NormFloat64()
	}
	if cfg.Regression {
		all.Name = "synthetic-regression"
		w := make([]float64, cfg.Dim)
		for i := range w {
			w[i] = rng.NormFloat64() / math.Sqrt(float64(cfg.Dim))
		}
		b := rng.NormFloat64()
		all.Targets = make([]float64, n)
		for i := range n {
			all.Targets[i] = dot(w, all.Row(i)) + b + cfg.Noise*rng.NormFloat64()
		}
	} else {
		all.Name = "synthetic-classification"
		all.Classes = cfg.Classes
		mu := make([]float64, cfg.Classes*cfg.Dim)
		s := cfg.Separation / math.Sqrt(2*float64(cfg.Dim))
		for i := range mu {
			mu[i] = rng.NormFloat64() * s
		}
		all.Labels = make([]int, n)
		for i := range n {
			y := rng.IntN(cfg.Classes)
			all.Labels[i] = y
			axpy(1, mu[y*cfg.Dim:(y+1)*cfg.Dim], all.Row(i))
		}
	}
	train := &Dataset{Name: all.Name + "/train", Dim: all.Dim, Classes: all.Classes, X: all.X[:cfg.Train*cfg.Dim]}
	test := &Dataset{Name: all.Name + "/test", Dim: all.Dim, Classes: all.Classes, X: all.X[cfg.Train*cfg.Dim:]}
	if cfg.Regression {
		train.Targets, test.Targets = all.Targets[:cfg.Train], all.Targets[cfg.Train:]
	} else {
		train.Labels, test.Labels = all.Labels[:cfg.Train], all.Labels[cfg.Train:]
	}
	return Data{Train: train, Test: test}, nil
}

// Open loads the data named by spec:
//
//   - "synthetic" or "synthetic:classification": the default synthetic
//     classification task (for logreg and mlp);
//   - "synthetic:regression": the default synthetic regression task (for
//     linreg);
//   - "mnist": the MNIST test set embedded in this package, split 8000
//     training and 2000 held-out images (see EmbeddedMNIST);
//   - "mnist:DIR": MNIST IDX files in DIR, such as a full download of the
//     train and t10k sets (see LoadMNIST).
func Open(spec string) (Data, error) {
	switch {
	case spec == "mnist":
		return EmbeddedMNIST()
	case spec == "synthetic" || spec == "synthetic:classification":
		return Synthetic(DefaultSyntheticConfig(false))
	case spec == "synthetic:regression":
		return Synthetic(DefaultSyntheticConfig(true))
	case strings.HasPrefix(spec, "mnist:"):
		dir := strings.TrimPrefix(spec, "mnist:")
		if dir == "" {
			return Data{}, fmt.Errorf("model: data spec %q: empty directory", spec)
		}
		return LoadMNIST(dir)
	}
	return Data{}, fmt.Errorf("model: unknown data spec %q (want synthetic, synthetic:regression, synthetic:classification, mnist or mnist:DIR)", spec)
}

// firstNonFinite returns the index of the first NaN or ±Inf in v, or -1.
func firstNonFinite(v []float64) int {
	// Fast path: a sum with gonum's assembly kernel is finite if every
	// element is (a NaN or an infinity makes it NaN or infinite). A sum of
	// finite values that overflows falls through to the exact scan.
	if s := floats.Sum(v); s-s == 0 {
		return -1
	}
	for i, x := range v {
		// x-x is 0 for finite x and NaN for ±Inf and NaN.
		if x-x != 0 {
			return i
		}
	}
	return -1
}
