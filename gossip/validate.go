package gossip

import (
	"errors"
	"fmt"
	"math"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/internal/f32"
	"github.com/pspnode/pspnode/internal/wire"
)

// Reason names why an incoming update was dropped. Reasons are metric label
// values, so they are short snake_case words. (The type is the wire
// formats': they give the same reasons for the exchange protocol's models.)
type Reason = wire.Reason

// Rejection reasons.
const (
	ReasonOversize        = wire.ReasonOversize        // message longer than MaxMessageSize
	ReasonMalformed       = wire.ReasonMalformed       // does not parse
	ReasonBadVersion      = wire.ReasonBadVersion      // unknown wire version
	ReasonBadEncoding     = wire.ReasonBadEncoding     // unknown encoding kind
	ReasonSenderMismatch  = wire.ReasonSenderMismatch  // sender field != signed pubsub From
	ReasonModelMismatch   = wire.ReasonModelMismatch   // model ID differs from ours
	ReasonWrongLength     = wire.ReasonWrongLength     // param count differs from ours
	ReasonNonFinite       = wire.ReasonNonFinite       // NaN or ±Inf value
	ReasonValueTooLarge   = wire.ReasonValueTooLarge   // |value| > MaxAbsValue
	ReasonNegativeStep    = wire.ReasonNegativeStep    // step < 0
	ReasonStepTooFarAhead = wire.ReasonStepTooFarAhead // step > local step + MaxStepAhead
)

// Reasons lists every rejection reason, for metrics and reports.
var Reasons = []Reason{
	ReasonOversize, ReasonMalformed, ReasonBadVersion, ReasonBadEncoding,
	ReasonSenderMismatch, ReasonModelMismatch, ReasonWrongLength, ReasonNonFinite,
	ReasonValueTooLarge, ReasonNegativeStep, ReasonStepTooFarAhead,
}

// RejectError is the error Validate returns: the reason and the detail.
type RejectError struct {
	Reason Reason
	Err    error
}

func (e *RejectError) Error() string {
	return fmt.Sprintf("gossip: update rejected (%s): %v", e.Reason, e.Err)
}

func (e *RejectError) Unwrap() error { return e.Err }

// ReasonOf returns the rejection reason carried by err, or "" if it has none.
func ReasonOf(err error) Reason {
	var re *RejectError
	if errors.As(err, &re) {
		return re.Reason
	}
	return ""
}

func reject(r Reason, format string, args ...any) error {
	return &RejectError{Reason: r, Err: fmt.Errorf(format, args...)}
}

// Limits are what an incoming update is checked against.
type Limits struct {
	// MaxMessageSize caps the encoded message, in bytes.
	MaxMessageSize int
	// ParamCount is the number of parameters of the local model.
	ParamCount int
	// ModelID must equal the update's model ID.
	ModelID uint32
	// MaxAbsValue caps |value| of every entry.
	MaxAbsValue float64
	// MaxStepAhead is how far the update's step may be ahead of the
	// receiver's own step; <= 0 disables the check.
	MaxStepAhead int64
}

// Validate decodes data and checks it fully against lim before anything may
// reach a model: size, version, encoding, structure, sender == from (the
// signed origin of the pubsub message), model ID, parameter count, finite
// values below MaxAbsValue, and a plausible step (non-negative, at most
// MaxStepAhead beyond localStep). Errors are *RejectError.
func Validate(data []byte, from peer.ID, localStep int64, lim Limits) (*Update, error) {
	if len(data) > lim.MaxMessageSize {
		return nil, reject(ReasonOversize, "%d bytes > cap %d", len(data), lim.MaxMessageSize)
	}
	u, err := DecodeUpdate(data)
	if err != nil {
		return nil, decodeReject(err)
	}
	if err := checkHeader(u, from, localStep, lim); err != nil {
		return nil, err
	}
	if err := checkValues(u.Values, lim); err != nil {
		return nil, err
	}
	return u, nil
}

// ValidateInto is Validate for a model or update whose values are to go
// into dst, a vector of lim.ParamCount values: a dense float32 update's
// values are checked where they lie in data and copied into dst, the only
// copy made of them; u.Values is dst. Other encodings are decoded as
// Validate does, then copied (sparse: dst holds zeros but at its entries).
// On error dst may have been written.
func ValidateInto(data []byte, dst []float32, from peer.ID, localStep int64, lim Limits) (*Update, error) {
	if len(data) > lim.MaxMessageSize {
		return nil, reject(ReasonOversize, "%d bytes > cap %d", len(data), lim.MaxMessageSize)
	}
	r := &reader{b: data}
	u, err := decodeHeader(r)
	if err == nil && u.Encoding != EncodingDense32 {
		u, err = Validate(data, from, localStep, lim)
		if err != nil {
			return nil, err
		}
		if len(dst) != u.ParamCount {
			return nil, reject(ReasonWrongLength, "%d params, want %d", u.ParamCount, len(dst))
		}
		clear(dst)
		if u.Encoding.sparse() {
			for j, i := range u.Indices {
				dst[i] = u.Values[j]
			}
		} else {
			copy(dst, u.Values)
		}
		u.Values, u.Indices = dst, nil
		return u, nil
	}
	if err != nil {
		return nil, decodeReject(err)
	}
	raw := r.b[r.off:]
	if uint64(len(raw)) != 4*uint64(u.ParamCount) {
		return nil, decodeReject(fmt.Errorf("%w: dense payload is %d bytes, want %d", ErrMalformed, len(raw), 4*uint64(u.ParamCount)))
	}
	if err := checkHeader(u, from, localStep, lim); err != nil {
		return nil, err
	}
	if len(dst) != u.ParamCount {
		return nil, reject(ReasonWrongLength, "%d params, want %d", u.ParamCount, len(dst))
	}
	if j, v := f32.Beyond(raw, boundOf(lim.MaxAbsValue)); j >= 0 {
		return nil, valueReject(j, v, lim)
	}
	f32.Decode(dst, raw)
	u.Values = dst
	u.WireSize = len(data)
	return u, nil
}

// decodeReject is the rejection for a decoding error.
func decodeReject(err error) error {
	switch {
	case errors.Is(err, ErrUnsupportedVersion):
		return &RejectError{Reason: ReasonBadVersion, Err: err}
	case errors.Is(err, ErrUnknownEncoding):
		return &RejectError{Reason: ReasonBadEncoding, Err: err}
	default:
		return &RejectError{Reason: ReasonMalformed, Err: err}
	}
}

// checkHeader checks what an update says of itself against lim: sender,
// model ID, parameter count, step.
func checkHeader(u *Update, from peer.ID, localStep int64, lim Limits) error {
	if from == "" || u.Sender != from {
		return reject(ReasonSenderMismatch, "sender field %s, signed origin %s", u.Sender, from)
	}
	if u.ModelID != lim.ModelID {
		return reject(ReasonModelMismatch, "model ID %#x, want %#x", u.ModelID, lim.ModelID)
	}
	if u.ParamCount != lim.ParamCount {
		return reject(ReasonWrongLength, "%d params, want %d", u.ParamCount, lim.ParamCount)
	}
	if u.Step < 0 {
		return reject(ReasonNegativeStep, "step %d", u.Step)
	}
	if lim.MaxStepAhead > 0 && localStep <= math.MaxInt64-lim.MaxStepAhead && u.Step > localStep+lim.MaxStepAhead {
		return reject(ReasonStepTooFarAhead, "step %d, local step %d, max ahead %d", u.Step, localStep, lim.MaxStepAhead)
	}
	return nil
}

// checkValues checks that every value is finite and within MaxAbsValue:
// one comparison per value (package f32), which NaN and ±Inf fail too.
func checkValues(vs []float32, lim Limits) error {
	if j, v := f32.BeyondValues(vs, boundOf(lim.MaxAbsValue)); j >= 0 {
		return valueReject(j, v, lim)
	}
	return nil
}

func valueReject(j int, v float32, lim Limits) error {
	if f := float64(v); math.IsNaN(f) || math.IsInf(f, 0) {
		return reject(ReasonNonFinite, "value %d is %v", j, v)
	}
	return reject(ReasonValueTooLarge, "value %d is %v, cap %v", j, v, lim.MaxAbsValue)
}

// boundOf is the float32 cap for MaxAbsValue m: the largest float32 not
// above m (so a value within m as a float64 is within it as a float32),
// the largest finite float32 for a larger m, and 0 for m ≤ 0 or NaN.
func boundOf(m float64) float32 {
	if !(m > 0) {
		return 0
	}
	if m >= math.MaxFloat32 {
		return math.MaxFloat32
	}
	b := float32(m)
	if float64(b) > m {
		b = math.Nextafter32(b, 0)
	}
	return b
}
