// Package wire holds the message bodies of the node's step and model
// protocols: their protocol IDs, encoders and checked decoders. The node
// (package node) frames and sends them; docs/protocols.md describes them
// for peers written in other languages, and its worked examples are
// checked against this package's encoders.
//
// Every message is a frame: a uvarint length, then that many bytes of body.
// Every body starts with a version byte (Version); a peer that sees
// another version rejects the message. Integers and floats are big-endian,
// fixed width. Frames larger than the protocol's cap are rejected before
// anything is allocated, so a hostile peer cannot make a node allocate more
// than the cap.
//
// Step protocol /psp/<job>/step/1.0.0, request and reply frames taking
// turns; a stream carries one exchange or, reused, several:
//
//	request: version u8 | kind u8 (1 query, 2 leaving) | step i64 | estimate f64
//	reply:   version u8 | flags u8 (bit 0: leaving) | step i64 | estimate f64 | interval f64
//
// estimate is the sender's population estimate (0 when it has none) and
// interval its recent mean seconds per step (0 when unknown), which DSSP
// uses. Step protocol /psp/<job>/step/1.1.0 sends the same bodies followed
// by tagged fields: the job's genesis and the sender's model (stepext.go).
//
// Model protocol /psp/<job>/model/1.0.0:
//
//	request: version u8
//	reply:   version u8 | step i64 | model id u32 | n u32 | n × f64 params
//
// Where things are:
//
//	step.go     the protocol IDs, the 1.0.0 step request and reply
//	stepext.go  step protocol 1.1.0: the genesis and model fields
//	model.go    the model reply
package wire
