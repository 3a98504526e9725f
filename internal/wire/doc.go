// Package wire is the node's three protocols on libp2p streams: each
// message's codec, one file per message, and how a stream carries it.
// The node (package node) decides what to ask and what to answer; this
// package turns that into bytes and back, on streams it opens, reuses,
// caps and bounds in time. docs/protocols.md describes the messages for
// peers written in other languages, and its worked examples are checked
// against this package's encoders.
//
// Every message is a frame: a uvarint length, then that many bytes of body
// (frame.go). Every body starts with a version byte (Version); a peer that
// sees another version rejects the message. Frames larger than the
// message's cap are refused before anything is allocated, so a hostile
// peer cannot make a node allocate more than the cap, and every wait on a
// stream has a deadline, also on transports whose SetDeadline does
// nothing. Every decoding error wraps ErrMalformed.
//
// Byte order: the fixed-width integers and floats of these protocols'
// own fields are big-endian (network byte order), as they have been since
// their 1.0.0 versions; a change would need new protocol versions for no
// gain. The one little-endian part is the exchange message's payload: an
// update of the gossip wire format (package gossip), whose values are
// float32 tensors, which trainers hold little-endian (numpy and torch on
// every CPU pspnode runs on) and the trainer API carries little-endian, so
// they cross from a trainer to the wire without a byte swap.
//
// Step protocol /psp/<job>/step/1.0.0 and 1.1.0 (step.go: the messages,
// asking with stream reuse; stepserve.go: answering), request and reply
// frames taking turns; a stream carries one exchange or, reused, several:
//
//	request: version u8 | kind u8 (1 query, 2 leaving) | step i64 | estimate f64
//	reply:   version u8 | flags u8 (bit 0: leaving) | step i64 | estimate f64 | interval f64
//
// estimate is the sender's population estimate (0 when it has none) and
// interval its recent mean seconds per step (0 when unknown), which DSSP
// uses. Version 1.1.0 sends the same bodies followed by tagged fields: the
// job's lineage (genesis) and the sender's model, and whether it sends
// progress notices (StepExt).
//
// Model protocol /psp/<job>/model/1.0.0 (model.go):
//
//	request: version u8
//	reply:   version u8 | step i64 | model id u32 | n u32 | n × f64 params
//
// Exchange protocol /psp/<job>/exchange/1.0.0 (exchange.go): one stream
// per model; the sender writes one frame, half-closes, reads one reply
// frame and closes.
//
//	request: version u8 | exchange u8 (1: epidemic) | payload
//	reply:   version u8 | status u8 (0: taken, else the reason's code) | exchange u8 (the answerer's)
//
// Inbound streams of each protocol are capped per peer and in all
// (inbound.go); the step protocol's idle streams make room for new ones.
package wire
