// Package gossip carries model updates over one GossipSub topic per job
// (psp/<job>/updates/1): the wire format, validation before anything reaches
// a model, and compact encodings.
//
// # Model
//
// Every node keeps its own copy of the model, a flat parameter vector of
// Config.ParamCount values. After each local step a node applies its own
// delta (new − old parameters) to its model and publishes it, float32,
// with Gossip.Publish; every other node adds the deltas it receives to its
// own model (additive updates). A node never gets its own update back: it has
// applied it already (read-my-writes). Nothing orders or acknowledges
// updates; the barrier (package psp) bounds how stale they may be.
//
// # Encodings
//
// Updates travel as float32 (EncodingDense32, the default), float16
// (EncodingDense16), or top-k sparse: the k = ceil(TopKFraction × n) entries
// of largest magnitude with float32 or float16 values (EncodingTopK32,
// EncodingTopK16). The sending Encoder keeps an error-feedback residual:
// whatever an update does not carry — entries outside the top k, float16 or
// float32 rounding, clamping — is added to the next delta, so every part of
// every delta is eventually sent, only later. A dense float32 delta
// within MaxAbsValue, with nothing held back, goes into its message as it
// is, and the encoder holds no vector at all. For MNIST logistic regression
// (7850 parameters) an update is about 31 KB dense float32, 16 KB dense
// float16, 4 KB top-10 % float32 and 2.4 KB top-10 % float16.
//
// The wire format (see codec.go) is a hand-written, versioned, little-endian
// binary layout: version, encoding, sender peer ID, step, model ID, parameter
// count, then either all values or a sparse block of delta-coded (uvarint)
// or bitmap indices and their values. DecodeUpdate never panics, checks every
// length before allocating, and is fuzzed (FuzzDecodeUpdate).
//
// # Validation
//
// Every incoming message passes a GossipSub topic validator before it is
// forwarded or delivered. Validate checks, in order: size cap, version,
// encoding, structure, that the sender field equals the message's signed
// origin (messages are signed, StrictSign), model ID, parameter count, step
// (non-negative, at most MaxStepAhead beyond the receiver's own step), and
// that every value is finite and at most MaxAbsValue in magnitude. A failed
// check is counted by Reason (Gossip.Stats, and prometheus counters if a
// Registerer is given), logged at debug level, and answered with
// ValidationReject, which costs the forwarding peer GossipSub score, so a
// persistent offender is first cut off from gossip and then graylisted
// (see PeerScore). Only "step too far ahead" is answered with
// ValidationIgnore, because it depends on the receiver's own progress.
// Nothing rejected ever reaches a handler.
//
// # Lifecycle
//
// New joins the topic and starts one receive goroutine, which calls the
// handlers (Config.Handler, Subscribe) one update at a time. Close stops the
// goroutine, leaves the topic, unregisters the validator and metrics, and
// stops the GossipSub router if New started it. To share one router with
// other protocols, build it with PubSubOptions and pass it as Config.PubSub.
package gossip
