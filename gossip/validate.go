package gossip

import (
	"errors"
	"fmt"
	"math"

	"github.com/libp2p/go-libp2p/core/peer"
)

// Reason names why an incoming update was dropped. Reasons are metric label
// values, so they are short snake_case words.
type Reason string

// Rejection reasons.
const (
	ReasonOversize        Reason = "oversize"           // message longer than MaxMessageSize
	ReasonMalformed       Reason = "malformed"          // does not parse
	ReasonBadVersion      Reason = "bad_version"        // unknown wire version
	ReasonBadEncoding     Reason = "bad_encoding"       // unknown encoding kind
	ReasonSenderMismatch  Reason = "sender_mismatch"    // sender field != signed pubsub From
	ReasonModelMismatch   Reason = "model_mismatch"     // model ID differs from ours
	ReasonWrongLength     Reason = "wrong_length"       // param count differs from ours
	ReasonNonFinite       Reason = "non_finite"         // NaN or ±Inf value
	ReasonValueTooLarge   Reason = "value_too_large"    // |value| > MaxAbsValue
	ReasonNegativeStep    Reason = "negative_step"      // step < 0
	ReasonStepTooFarAhead Reason = "step_too_far_ahead" // step > local step + MaxStepAhead
)

// Reasons lists every rejection reason, for metrics and reports.
var Reasons = []Reason{
	ReasonOversize, ReasonMalformed, ReasonBadVersion, ReasonBadEncoding,
	ReasonSenderMismatch, ReasonModelMismatch, ReasonWrongLength, ReasonNonFinite,
	ReasonValueTooLarge, ReasonNegativeStep, ReasonStepTooFarAhead,
}

// Ignore reports whether a message dropped for this reason should be ignored
// rather than rejected in GossipSub terms. Only a step too far ahead is
// ignored: it depends on the receiver's own progress, so an honest fast peer
// (or a slow receiver) can trigger it and must not lose score. Every other
// reason is a property of the message alone and costs the sender score.
func (r Reason) Ignore() bool { return r == ReasonStepTooFarAhead }

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
		switch {
		case errors.Is(err, ErrUnsupportedVersion):
			return nil, &RejectError{Reason: ReasonBadVersion, Err: err}
		case errors.Is(err, ErrUnknownEncoding):
			return nil, &RejectError{Reason: ReasonBadEncoding, Err: err}
		default:
			return nil, &RejectError{Reason: ReasonMalformed, Err: err}
		}
	}
	if from == "" || u.Sender != from {
		return nil, reject(ReasonSenderMismatch, "sender field %s, signed origin %s", u.Sender, from)
	}
	if u.ModelID != lim.ModelID {
		return nil, reject(ReasonModelMismatch, "model ID %#x, want %#x", u.ModelID, lim.ModelID)
	}
	if u.ParamCount != lim.ParamCount {
		return nil, reject(ReasonWrongLength, "%d params, want %d", u.ParamCount, lim.ParamCount)
	}
	if u.Step < 0 {
		return nil, reject(ReasonNegativeStep, "step %d", u.Step)
	}
	if lim.MaxStepAhead > 0 && localStep <= math.MaxInt64-lim.MaxStepAhead && u.Step > localStep+lim.MaxStepAhead {
		return nil, reject(ReasonStepTooFarAhead, "step %d, local step %d, max ahead %d", u.Step, localStep, lim.MaxStepAhead)
	}
	for j, v := range u.Values {
		f := float64(v)
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return nil, reject(ReasonNonFinite, "value %d is %v", j, v)
		}
		if math.Abs(f) > lim.MaxAbsValue {
			return nil, reject(ReasonValueTooLarge, "value %d is %v, cap %v", j, v, lim.MaxAbsValue)
		}
	}
	return u, nil
}
