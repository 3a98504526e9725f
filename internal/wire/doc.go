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
// gain. The little-endian parts are a model's values (the model and
// exchange protocols' blocks): float32 tensors, which trainers hold
// little-endian (numpy and torch on every CPU pspnode runs on) and the
// trainer API carries little-endian, so they cross from a trainer to the
// wire without a byte swap.
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
// Model protocol /psp/<job>/model/2.0.0 (model.go): a range of blocks of
// the model (ExchangeBlock values each), so that a joiner fetches a large
// model from several peers at once and resumes a broken range elsewhere.
//
//	request: version u8 (2) | first block u32 | count u32   (count 0: the head alone)
//	reply:   version u8 (2) | step i64 | model id u32 | n u32 | block u32   (a frame)
//	         then count × (index u32 | count u32 | count × f32 little-endian)
//
// Exchange protocol /psp/<job>/exchange/2.0.0 (exchange.go): one stream
// per model. The sender offers the model; the receiver's verdict comes
// before any of its bytes; a model taken follows in blocks, each judged
// and added as it comes; a final answer says whether all of it was taken.
//
//	offer:   version u8 (2) | exchange u8 | encoding u8 (1: f32, 2: bf16, 3: int8, 4: int4) | 0 | step i64 |
//	         model id u32 | n u32 | block u32 | first u32 | count u32
//	verdict, final: version u8 (2) | status u8 (0: taken, else the reason's code) | exchange u8
//	blocks:  as the model protocol's, the values in the offer's encoding:
//	         f32 as there; bf16: count × u16 little-endian (a float32's upper half);
//	         int8: per chunk of 256 values (the last shorter), scale f32 LE | that many × i8,
//	         each value i8 × scale; int4: the same chunks, scale f32 LE | ceil(that many / 2)
//	         bytes, two signed 4-bit values a byte, low half first (compress.go)
//
// A model cut into fragments (streaming DiLoCo) goes one fragment per
// offer: the offer's fourth byte is then 1 and it ends with the
// fragment's index and the number of fragments, u32 each (fragment.go).
//
// Inbound streams of each protocol are capped per peer and in all
// (inbound.go); the step protocol's idle streams make room for new ones.
package wire
