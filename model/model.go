// Models: the Model interface, shapes and tensors, New, and the linear
// regression, logistic regression and MLP models. The package doc is in
// doc.go.

package model

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"

	"gonum.org/v1/gonum/floats"
	"gonum.org/v1/gonum/mat"
)

// Tensor names one block of a flat parameter vector: a Rows×Cols matrix
// stored row-major. A bias vector is a 1×Cols tensor.
type Tensor struct {
	Name string
	Rows int
	Cols int
}

// Size is the number of parameters in the tensor.
func (t Tensor) Size() int { return t.Rows * t.Cols }

// Shape is the layout of a model's flat parameter vector: its tensors in
// order, each stored row-major, with no gaps. Two nodes may exchange updates
// only if their shapes are Equal.
type Shape []Tensor

// NumParams is the total number of parameters, the length of a parameter or
// update vector.
func (s Shape) NumParams() int {
	n := 0
	for _, t := range s {
		n += t.Size()
	}
	return n
}

// Equal reports whether s and o describe the same layout.
func (s Shape) Equal(o Shape) bool {
	if len(s) != len(o) {
		return false
	}
	for i := range s {
		if s[i] != o[i] {
			return false
		}
	}
	return true
}

// String renders the shape as, for example, "W[10x784] b[1x10]".
func (s Shape) String() string {
	parts := make([]string, len(s))
	for i, t := range s {
		parts[i] = fmt.Sprintf("%s[%dx%d]", t.Name, t.Rows, t.Cols)
	}
	return strings.Join(parts, " ")
}

// Model is a differentiable model whose parameters live in one flat
// []float64 laid out as its Shape. Models are stateless and safe for
// concurrent use: all state is in the parameter vector the caller passes.
type Model interface {
	// Name is the name New accepts for this model, e.g. "logreg".
	Name() string
	// Shape is the layout of the parameter vector.
	Shape() Shape
	// NumParams is Shape().NumParams().
	NumParams() int
	// InputDim is the number of features per example.
	InputDim() int
	// Outputs is the length of Predict's output: the number of classes for
	// a classifier, 1 for a regression model.
	Outputs() int
	// Classifier reports whether the model predicts class labels (it uses
	// Dataset.Labels) rather than real targets (Dataset.Targets).
	Classifier() bool
	// Init returns a fresh parameter vector. Every node of a job must start
	// from the same parameters, so seed rng from the job, not the node. The
	// convex models (linreg, logreg) start at zero and ignore rng.
	Init(rng *rand.Rand) []float64
	// LossGrad returns the mean loss of params over the examples of b and,
	// if grad is not nil, overwrites grad with the gradient of that mean
	// loss. It fails, without panicking, if the lengths or the dataset do
	// not match the model.
	LossGrad(params []float64, b *Dataset, grad []float64) (float64, error)
	// Predict writes the model's output for one example x into out
	// (length Outputs()): class probabilities for a classifier, the
	// predicted target for a regression model.
	Predict(params, x, out []float64) error
	// PredictBatch writes the outputs for the rows of b into out
	// (row-major, b.Len()×Outputs()), as Predict would row by row, but
	// with one matrix product.
	PredictBatch(params []float64, b *Dataset, out []float64) error
}

// DefaultHidden is the hidden-layer width of New("mlp", ...).
const DefaultHidden = 64

// New returns the model called name for inputs of inputDim features:
//
//   - "linreg": linear regression y = w·x + b with squared loss ½(y−ŷ)²;
//     classes must be 0 or 1 (one real output).
//   - "logreg": multinomial logistic regression, softmax(W x + b) with
//     cross-entropy loss, over classes ≥ 2 classes.
//   - "mlp" or "mlp:H": a multilayer perceptron with one hidden ReLU layer of
//     H units (DefaultHidden if omitted), softmax output and cross-entropy.
func New(name string, inputDim, classes int) (Model, error) {
	switch {
	case name == "linreg":
		if classes > 1 {
			return nil, fmt.Errorf("model: linreg has one real output, got classes=%d", classes)
		}
		return NewLinReg(inputDim)
	case name == "logreg":
		return NewLogReg(inputDim, classes)
	case name == "mlp":
		return NewMLP(inputDim, DefaultHidden, classes)
	case strings.HasPrefix(name, "mlp:"):
		h, err := strconv.Atoi(strings.TrimPrefix(name, "mlp:"))
		if err != nil {
			return nil, fmt.Errorf("model: bad hidden width in %q: %w", name, err)
		}
		return NewMLP(inputDim, h, classes)
	}
	return nil, fmt.Errorf("model: unknown model %q (want linreg, logreg, mlp or mlp:H)", name)
}

// maxParams caps model sizes so that a bad configuration fails clearly
// instead of exhausting memory.
const maxParams = 1 << 26

func checkDims(name string, dims ...int) error {
	n := 1
	for _, d := range dims {
		if d < 1 {
			return fmt.Errorf("model: %s: dimensions must be positive, got %v", name, dims)
		}
		if d > maxParams || n > maxParams/d {
			return fmt.Errorf("model: %s: dimensions %v too large", name, dims)
		}
		n *= d
	}
	return nil
}

// checkCall validates the arguments of LossGrad.
func checkCall(m Model, params []float64, b *Dataset, grad []float64) error {
	if len(params) != m.NumParams() {
		return fmt.Errorf("model: %s: params has length %d, want %d", m.Name(), len(params), m.NumParams())
	}
	if grad != nil && len(grad) != m.NumParams() {
		return fmt.Errorf("model: %s: grad has length %d, want %d", m.Name(), len(grad), m.NumParams())
	}
	if err := b.compatible(m); err != nil {
		return err
	}
	if b.Len() == 0 {
		return fmt.Errorf("model: %s: empty batch", m.Name())
	}
	return nil
}

func checkPredictBatch(m Model, params []float64, b *Dataset, out []float64) error {
	if len(params) != m.NumParams() {
		return fmt.Errorf("model: %s: params has length %d, want %d", m.Name(), len(params), m.NumParams())
	}
	if b == nil || b.Dim != m.InputDim() || len(b.X) != b.Len()*b.Dim || b.Len() == 0 {
		return fmt.Errorf("model: %s: batch must be non-empty with dimension %d", m.Name(), m.InputDim())
	}
	if len(out) != b.Len()*m.Outputs() {
		return fmt.Errorf("model: %s: output has length %d, want %d", m.Name(), len(out), b.Len()*m.Outputs())
	}
	return nil
}

func checkPredict(m Model, params, x, out []float64) error {
	if len(params) != m.NumParams() {
		return fmt.Errorf("model: %s: params has length %d, want %d", m.Name(), len(params), m.NumParams())
	}
	if len(x) != m.InputDim() {
		return fmt.Errorf("model: %s: input has length %d, want %d", m.Name(), len(x), m.InputDim())
	}
	if len(out) != m.Outputs() {
		return fmt.Errorf("model: %s: output has length %d, want %d", m.Name(), len(out), m.Outputs())
	}
	return nil
}

// LinReg is linear regression, ŷ = w·x + b, with the squared loss
// ½(ŷ − y)² averaged over a batch. Parameters: w[1×D] then b[1×1].
type LinReg struct{ dim int }

// NewLinReg returns linear regression over inputDim features.
func NewLinReg(inputDim int) (*LinReg, error) {
	if err := checkDims("linreg", inputDim); err != nil {
		return nil, err
	}
	return &LinReg{dim: inputDim}, nil
}

func (m *LinReg) Name() string     { return "linreg" }
func (m *LinReg) InputDim() int    { return m.dim }
func (m *LinReg) Outputs() int     { return 1 }
func (m *LinReg) Classifier() bool { return false }
func (m *LinReg) NumParams() int   { return m.dim + 1 }
func (m *LinReg) Shape() Shape {
	return Shape{{Name: "w", Rows: 1, Cols: m.dim}, {Name: "b", Rows: 1, Cols: 1}}
}

// Init returns zeros.
func (m *LinReg) Init(*rand.Rand) []float64 { return make([]float64, m.NumParams()) }

func (m *LinReg) LossGrad(params []float64, b *Dataset, grad []float64) (float64, error) {
	if err := checkCall(m, params, b, grad); err != nil {
		return 0, err
	}
	n, d := b.Len(), m.dim
	w, bias := params[:d], params[d]
	if grad != nil {
		clear(grad)
	}
	inv := 1 / float64(n)
	loss := 0.0
	for i := range n {
		x := b.Row(i)
		r := dot(w, x) + bias - b.Targets[i]
		loss += 0.5 * r * r
		if grad != nil {
			axpy(r*inv, x, grad[:d])
			grad[d] += r * inv
		}
	}
	return loss * inv, nil
}

func (m *LinReg) Predict(params, x, out []float64) error {
	if err := checkPredict(m, params, x, out); err != nil {
		return err
	}
	out[0] = dot(params[:m.dim], x) + params[m.dim]
	return nil
}

func (m *LinReg) PredictBatch(params []float64, b *Dataset, out []float64) error {
	if err := checkPredictBatch(m, params, b, out); err != nil {
		return err
	}
	for i := range b.Len() {
		out[i] = dot(params[:m.dim], b.Row(i)) + params[m.dim]
	}
	return nil
}

// LogReg is multinomial logistic regression: p = softmax(W x + b) with the
// cross-entropy loss −log p_y averaged over a batch. Parameters: W[K×D]
// (one row per class) then b[1×K]. For MNIST, D = 784, K = 10 and
// NumParams = 7850.
type LogReg struct{ dim, classes int }

// NewLogReg returns logistic regression over inputDim features and classes
// classes (at least 2).
func NewLogReg(inputDim, classes int) (*LogReg, error) {
	if err := checkDims("logreg", inputDim, classes); err != nil {
		return nil, err
	}
	if classes < 2 {
		return nil, fmt.Errorf("model: logreg needs at least 2 classes, got %d", classes)
	}
	return &LogReg{dim: inputDim, classes: classes}, nil
}

func (m *LogReg) Name() string     { return "logreg" }
func (m *LogReg) InputDim() int    { return m.dim }
func (m *LogReg) Outputs() int     { return m.classes }
func (m *LogReg) Classifier() bool { return true }
func (m *LogReg) NumParams() int   { return m.classes*m.dim + m.classes }
func (m *LogReg) Shape() Shape {
	return Shape{{Name: "W", Rows: m.classes, Cols: m.dim}, {Name: "b", Rows: 1, Cols: m.classes}}
}

// Init returns zeros.
func (m *LogReg) Init(*rand.Rand) []float64 { return make([]float64, m.NumParams()) }

func (m *LogReg) LossGrad(params []float64, b *Dataset, grad []float64) (float64, error) {
	if err := checkCall(m, params, b, grad); err != nil {
		return 0, err
	}
	n, d, k := b.Len(), m.dim, m.classes
	x := mat.NewDense(n, d, b.X)
	w := mat.NewDense(k, d, params[:k*d])
	z := mat.NewDense(n, k, nil)
	z.Mul(x, w.T()) // Z = X Wᵀ
	raw := z.RawMatrix()
	loss := softmaxXent(raw.Data, n, k, params[k*d:], b.Labels)
	if grad == nil {
		return loss, nil
	}
	// raw now holds dL/dZ = (P − onehot(y)) / n.
	gw := mat.NewDense(k, d, grad[:k*d])
	gw.Mul(z.T(), x) // dW = dZᵀ X
	colSums(raw.Data, n, k, grad[k*d:])
	return loss, nil
}

func (m *LogReg) Predict(params, x, out []float64) error {
	if err := checkPredict(m, params, x, out); err != nil {
		return err
	}
	d := m.dim
	for c := range m.classes {
		out[c] = dot(params[c*d:(c+1)*d], x) + params[m.classes*d+c]
	}
	softmax(out)
	return nil
}

func (m *LogReg) PredictBatch(params []float64, b *Dataset, out []float64) error {
	if err := checkPredictBatch(m, params, b, out); err != nil {
		return err
	}
	m.logits(params, b, out)
	softmaxRows(out, b.Len(), m.classes)
	return nil
}

// logits writes W x + b for each row of b into out (b.Len()×K).
func (m *LogReg) logits(params []float64, b *Dataset, out []float64) {
	n, d, k := b.Len(), m.dim, m.classes
	z := mat.NewDense(n, k, out)
	z.Mul(mat.NewDense(n, d, b.X), mat.NewDense(k, d, params[:k*d]).T())
	addBias(out, n, k, params[k*d:])
}

// MLP is a multilayer perceptron with one hidden ReLU layer:
// p = softmax(W2 relu(W1 x + b1) + b2), cross-entropy loss averaged over a
// batch. Parameters: W1[H×D], b1[1×H], W2[K×H], b2[1×K].
type MLP struct{ dim, hidden, classes int }

// NewMLP returns an MLP with hidden ReLU units between inputDim features and
// classes classes (at least 2).
func NewMLP(inputDim, hidden, classes int) (*MLP, error) {
	if err := checkDims("mlp", inputDim, hidden, classes); err != nil {
		return nil, err
	}
	if err := checkDims("mlp", hidden, inputDim+classes+2); err != nil {
		return nil, err
	}
	if classes < 2 {
		return nil, fmt.Errorf("model: mlp needs at least 2 classes, got %d", classes)
	}
	return &MLP{dim: inputDim, hidden: hidden, classes: classes}, nil
}

func (m *MLP) Name() string {
	if m.hidden == DefaultHidden {
		return "mlp"
	}
	return "mlp:" + strconv.Itoa(m.hidden)
}
func (m *MLP) InputDim() int    { return m.dim }
func (m *MLP) Outputs() int     { return m.classes }
func (m *MLP) Classifier() bool { return true }
func (m *MLP) NumParams() int   { return m.Shape().NumParams() }
func (m *MLP) Shape() Shape {
	return Shape{
		{Name: "W1", Rows: m.hidden, Cols: m.dim},
		{Name: "b1", Rows: 1, Cols: m.hidden},
		{Name: "W2", Rows: m.classes, Cols: m.hidden},
		{Name: "b2", Rows: 1, Cols: m.classes},
	}
}

// split returns views of the four tensors of p.
func (m *MLP) split(p []float64) (w1, b1, w2, b2 []float64) {
	h, d, k := m.hidden, m.dim, m.classes
	o := 0
	w1, o = p[o:o+h*d], o+h*d
	b1, o = p[o:o+h], o+h
	w2, o = p[o:o+k*h], o+k*h
	b2 = p[o : o+k]
	return
}

// Init draws W1 and W2 with He initialisation (normal, variance 2/fan-in)
// and sets the biases to zero.
func (m *MLP) Init(rng *rand.Rand) []float64 {
	p := make([]float64, m.NumParams())
	w1, _, w2, _ := m.split(p)
	s1 := math.Sqrt(2 / float64(m.dim))
	for i := range w1 {
		w1[i] = rng.NormFloat64() * s1
	}
	s2 := math.Sqrt(2 / float64(m.hidden))
	for i := range w2 {
		w2[i] = rng.NormFloat64() * s2
	}
	return p
}

func (m *MLP) LossGrad(params []float64, b *Dataset, grad []float64) (float64, error) {
	if err := checkCall(m, params, b, grad); err != nil {
		return 0, err
	}
	n, d, h, k := b.Len(), m.dim, m.hidden, m.classes
	w1, b1, w2, b2 := m.split(params)
	x := mat.NewDense(n, d, b.X)
	W1 := mat.NewDense(h, d, w1)
	W2 := mat.NewDense(k, h, w2)

	a := mat.NewDense(n, h, nil)
	a.Mul(x, W1.T()) // A = X W1ᵀ + b1, then ReLU in place
	ad := a.RawMatrix().Data
	for i := range n {
		row := ad[i*h : (i+1)*h]
		for j := range row {
			if v := row[j] + b1[j]; v > 0 {
				row[j] = v
			} else {
				row[j] = 0
			}
		}
	}
	z := mat.NewDense(n, k, nil)
	z.Mul(a, W2.T())
	zd := z.RawMatrix().Data
	loss := softmaxXent(zd, n, k, b2, b.Labels)
	if grad == nil {
		return loss, nil
	}
	g1, gb1, g2, gb2 := m.split(grad)
	G2 := mat.NewDense(k, h, g2)
	G2.Mul(z.T(), a) // dW2 = dZᵀ H
	colSums(zd, n, k, gb2)
	dh := mat.NewDense(n, h, nil)
	dh.Mul(z, W2) // dH = dZ W2
	dd := dh.RawMatrix().Data
	for i, v := range ad {
		if v <= 0 { // ReLU was inactive (ties at 0 count as inactive)
			dd[i] = 0
		}
	}
	G1 := mat.NewDense(h, d, g1)
	G1.Mul(dh.T(), x) // dW1 = dAᵀ X
	colSums(dd, n, h, gb1)
	return loss, nil
}

func (m *MLP) Predict(params, x, out []float64) error {
	if err := checkPredict(m, params, x, out); err != nil {
		return err
	}
	w1, b1, w2, b2 := m.split(params)
	d, h := m.dim, m.hidden
	hid := make([]float64, h)
	for j := range h {
		hid[j] = max(0, dot(w1[j*d:(j+1)*d], x)+b1[j])
	}
	for c := range out {
		out[c] = dot(w2[c*h:(c+1)*h], hid) + b2[c]
	}
	softmax(out)
	return nil
}

func (m *MLP) PredictBatch(params []float64, b *Dataset, out []float64) error {
	if err := checkPredictBatch(m, params, b, out); err != nil {
		return err
	}
	m.logits(params, b, out)
	softmaxRows(out, b.Len(), m.classes)
	return nil
}

// logits writes the pre-softmax outputs for each row of b into out
// (b.Len()×K).
func (m *MLP) logits(params []float64, b *Dataset, out []float64) {
	n, d, h, k := b.Len(), m.dim, m.hidden, m.classes
	w1, b1, w2, b2 := m.split(params)
	a := mat.NewDense(n, h, nil)
	a.Mul(mat.NewDense(n, d, b.X), mat.NewDense(h, d, w1).T())
	ad := a.RawMatrix().Data
	for i := range n {
		row := ad[i*h : (i+1)*h]
		for j := range row {
			row[j] = max(0, row[j]+b1[j])
		}
	}
	z := mat.NewDense(n, k, out)
	z.Mul(a, mat.NewDense(k, h, w2).T())
	addBias(out, n, k, b2)
}

// softmaxXent adds bias to each row of the n×k logits z, returns the mean
// cross-entropy against labels, and leaves in z the gradient of that mean
// with respect to the logits: (softmax(z) − onehot(y)) / n.
func softmaxXent(z []float64, n, k int, bias []float64, labels []int) float64 {
	inv := 1 / float64(n)
	loss := 0.0
	for i := range n {
		row := z[i*k : (i+1)*k]
		for c := range row {
			row[c] += bias[c]
		}
		lse := logSumExp(row)
		y := labels[i]
		loss += lse - row[y]
		for c := range row {
			row[c] = math.Exp(row[c]-lse) * inv
		}
		row[y] -= inv
	}
	return loss * inv
}

// logSumExp returns log Σ exp(v) computed stably.
func logSumExp(v []float64) float64 {
	mx := math.Inf(-1)
	for _, x := range v {
		mx = max(mx, x)
	}
	if math.IsInf(mx, 0) {
		return mx
	}
	s := 0.0
	for _, x := range v {
		s += math.Exp(x - mx)
	}
	return mx + math.Log(s)
}

// addBias adds bias to each row of the n×k matrix z.
func addBias(z []float64, n, k int, bias []float64) {
	for i := range n {
		row := z[i*k : (i+1)*k]
		for c := range row {
			row[c] += bias[c]
		}
	}
}

// softmaxRows replaces each row of the n×k matrix z by its softmax.
func softmaxRows(z []float64, n, k int) {
	for i := range n {
		softmax(z[i*k : (i+1)*k])
	}
}

// classifier is implemented by the softmax models: logits writes the
// pre-softmax scores of the rows of b into out (b.Len()×Outputs()), which
// gives both the loss and the accuracy from one matrix product. Arguments
// are assumed checked.
type classifier interface {
	logits(params []float64, b *Dataset, out []float64)
}

// softmax replaces v by softmax(v).
func softmax(v []float64) {
	lse := logSumExp(v)
	for i := range v {
		v[i] = math.Exp(v[i] - lse)
	}
}

// colSums writes the column sums of the n×k row-major matrix a into dst.
func colSums(a []float64, n, k int, dst []float64) {
	clear(dst)
	for i := range n {
		row := a[i*k : (i+1)*k]
		for c, v := range row {
			dst[c] += v
		}
	}
}

func dot(a, b []float64) float64 {
	s := 0.0
	b = b[:len(a)]
	for i, v := range a {
		s += v * b[i]
	}
	return s
}

// axpy adds alpha·x to y (gonum's assembly kernel); len(y) must equal len(x).
func axpy(alpha float64, x, y []float64) {
	floats.AddScaled(y, alpha, x)
}
