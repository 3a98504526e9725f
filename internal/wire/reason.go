package wire

// Reason names why an incoming update or model was dropped. Reasons are
// metric label values, so they are short snake_case words. Package gossip
// names the same type (gossip.Reason) for its validation; the type lives
// here, below both, so that the wire formats need not import gossip.
type Reason string

// The reasons gossip's validation gives (gossip.Validate), which the
// exchange protocol's replies also carry.
const (
	ReasonOversize        Reason = "oversize"           // message longer than the size bound
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

// Ignore reports whether a message dropped for this reason should be ignored
// rather than rejected in GossipSub terms. Only a step too far ahead is
// ignored: it depends on the receiver's own progress, so an honest fast peer
// (or a slow receiver) can trigger it and must not lose score. Every other
// reason is a property of the message alone and costs the sender score.
func (r Reason) Ignore() bool { return r == ReasonStepTooFarAhead }
