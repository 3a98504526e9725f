package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/pspnode/pspnode/psp"
)

// ModelHeaderLen is the length of a model reply's body before its
// parameters: version, step, model id and parameter count.
const ModelHeaderLen = 1 + 8 + 4 + 4

// ErrModelMismatch is wrapped by UnmarshalModel's error for a reply of
// another model than the receiver's. It is not a malformed message: the
// two nodes must not be in one job.
var ErrModelMismatch = errors.New("model mismatch")

// ModelSnapshot is a model transferred to a joining node.
type ModelSnapshot struct {
	Step    psp.Step
	ModelID uint32
	Params  []float64
}

// MaxModelFrame is the largest model reply accepted for n parameters.
func MaxModelFrame(n int) int { return ModelHeaderLen + 8*n }

// MarshalModel encodes a model reply body.
func MarshalModel(m ModelSnapshot) []byte {
	b := make([]byte, ModelHeaderLen+8*len(m.Params))
	b[0] = Version
	binary.BigEndian.PutUint64(b[1:], uint64(m.Step))
	binary.BigEndian.PutUint32(b[9:], m.ModelID)
	binary.BigEndian.PutUint32(b[13:], uint32(len(m.Params)))
	for i, v := range m.Params {
		binary.BigEndian.PutUint64(b[ModelHeaderLen+8*i:], math.Float64bits(v))
	}
	return b
}

// UnmarshalModel decodes a model reply body and verifies it against what
// the receiver runs: the model id, the parameter count, and that every
// parameter is finite.
func UnmarshalModel(b []byte, modelID uint32, n int) (ModelSnapshot, error) {
	if len(b) < ModelHeaderLen {
		return ModelSnapshot{}, fmt.Errorf("%w: model reply of %d bytes is shorter than its header", ErrMalformed, len(b))
	}
	if b[0] != Version {
		return ModelSnapshot{}, fmt.Errorf("%w: model reply version %d, want %d", ErrMalformed, b[0], Version)
	}
	m := ModelSnapshot{
		Step:    psp.Step(binary.BigEndian.Uint64(b[1:])),
		ModelID: binary.BigEndian.Uint32(b[9:]),
	}
	count := binary.BigEndian.Uint32(b[13:])
	switch {
	case m.Step < 0:
		return ModelSnapshot{}, fmt.Errorf("%w: negative step %d", ErrMalformed, m.Step)
	case m.ModelID != modelID || int64(count) != int64(n):
		return ModelSnapshot{}, fmt.Errorf("%w: the peer runs model id %#08x with %d parameters; the receiver runs model id %#08x with %d",
			ErrModelMismatch, m.ModelID, count, modelID, n)
	case len(b) != ModelHeaderLen+8*n:
		return ModelSnapshot{}, fmt.Errorf("%w: model reply of %d bytes, want %d", ErrMalformed, len(b), ModelHeaderLen+8*n)
	}
	m.Params = make([]float64, n)
	for i := range m.Params {
		v := math.Float64frombits(binary.BigEndian.Uint64(b[ModelHeaderLen+8*i:]))
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return ModelSnapshot{}, fmt.Errorf("%w: parameter %d is %v", ErrMalformed, i, v)
		}
		m.Params[i] = v
	}
	return m, nil
}
