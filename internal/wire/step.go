package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/pspnode/pspnode/psp"
)

// Version is the first byte of every body.
const Version = 1

const (
	kindQuery   = 1
	kindLeaving = 2
)

const (
	stepRequestLen = 1 + 1 + 8 + 8
	stepReplyLen   = 1 + 1 + 8 + 8 + 8
	// MaxStepFrame caps a step message of protocol 1.0.0.
	MaxStepFrame = 64
)

// ErrMalformed is wrapped by every decoding error of this package.
var ErrMalformed = errors.New("malformed message")

// StepProtocol returns the ID of version 1.0.0 of a job's step protocol.
func StepProtocol(job string) protocol.ID { return protocol.ID("/psp/" + job + "/step/1.0.0") }

// StepProtocolExt returns the ID of version 1.1.0 of a job's step protocol.
func StepProtocolExt(job string) protocol.ID { return protocol.ID("/psp/" + job + "/step/1.1.0") }

// ModelProtocol returns the ID of a job's model protocol.
func ModelProtocol(job string) protocol.ID { return protocol.ID("/psp/" + job + "/model/1.0.0") }

// StepRequest is what a node sends when it asks a peer for its step.
type StepRequest struct {
	Leaving  bool     // the sender is leaving the job; no reply is expected
	Step     psp.Step // the sender's step
	Estimate float64  // the sender's population estimate, 0 if none
	// Ext is what a request of step protocol 1.1.0 carried beyond the
	// 1.0.0 body (stepext.go): set by UnmarshalStepRequestExt, nil for a
	// 1.0.0 request. The encoders leave it out; MarshalStepRequestExt
	// takes the fields to send apart.
	Ext *StepExt
}

// StepReply is a peer's answer.
type StepReply struct {
	Leaving  bool
	Step     psp.Step
	Estimate float64
	Interval float64 // seconds per step, recent mean; 0 if unknown
	// Ext is as in StepRequest: nil for a 1.0.0 reply.
	Ext *StepExt
}

func checkFloat(name string, v float64) error {
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return fmt.Errorf("%w: %s %v is not a finite non-negative number", ErrMalformed, name, v)
	}
	return nil
}

// MarshalStepRequest encodes a request body of step protocol 1.0.0
// (without the frame, and without q.Ext).
func MarshalStepRequest(q StepRequest) []byte {
	return appendStepRequest(make([]byte, 0, stepRequestLen), q)
}

// appendStepRequest appends the 1.0.0 body of q to b.
func appendStepRequest(b []byte, q StepRequest) []byte {
	kind := byte(kindQuery)
	if q.Leaving {
		kind = kindLeaving
	}
	b = append(b, Version, kind)
	b = binary.BigEndian.AppendUint64(b, uint64(q.Step))
	return binary.BigEndian.AppendUint64(b, math.Float64bits(q.Estimate))
}

// UnmarshalStepRequest decodes and checks a request body.
func UnmarshalStepRequest(b []byte) (StepRequest, error) {
	if len(b) != stepRequestLen {
		return StepRequest{}, fmt.Errorf("%w: step request of %d bytes, want %d", ErrMalformed, len(b), stepRequestLen)
	}
	if b[0] != Version {
		return StepRequest{}, fmt.Errorf("%w: step request version %d, want %d", ErrMalformed, b[0], Version)
	}
	if b[1] != kindQuery && b[1] != kindLeaving {
		return StepRequest{}, fmt.Errorf("%w: step request kind %d", ErrMalformed, b[1])
	}
	q := StepRequest{
		Leaving:  b[1] == kindLeaving,
		Step:     psp.Step(binary.BigEndian.Uint64(b[2:])),
		Estimate: math.Float64frombits(binary.BigEndian.Uint64(b[10:])),
	}
	if q.Step < 0 {
		return StepRequest{}, fmt.Errorf("%w: negative step %d", ErrMalformed, q.Step)
	}
	if err := checkFloat("estimate", q.Estimate); err != nil {
		return StepRequest{}, err
	}
	return q, nil
}

// MarshalStepReply encodes a reply body of step protocol 1.0.0 (without
// r.Ext).
func MarshalStepReply(r StepReply) []byte {
	return appendStepReply(make([]byte, 0, stepReplyLen), r)
}

// appendStepReply appends the 1.0.0 body of r to b.
func appendStepReply(b []byte, r StepReply) []byte {
	var flags byte
	if r.Leaving {
		flags = 1
	}
	b = append(b, Version, flags)
	b = binary.BigEndian.AppendUint64(b, uint64(r.Step))
	b = binary.BigEndian.AppendUint64(b, math.Float64bits(r.Estimate))
	return binary.BigEndian.AppendUint64(b, math.Float64bits(r.Interval))
}

// UnmarshalStepReply decodes and checks a reply body.
func UnmarshalStepReply(b []byte) (StepReply, error) {
	if len(b) != stepReplyLen {
		return StepReply{}, fmt.Errorf("%w: step reply of %d bytes, want %d", ErrMalformed, len(b), stepReplyLen)
	}
	if b[0] != Version {
		return StepReply{}, fmt.Errorf("%w: step reply version %d, want %d", ErrMalformed, b[0], Version)
	}
	if b[1]&^1 != 0 {
		return StepReply{}, fmt.Errorf("%w: step reply flags %#x", ErrMalformed, b[1])
	}
	r := StepReply{
		Leaving:  b[1]&1 != 0,
		Step:     psp.Step(binary.BigEndian.Uint64(b[2:])),
		Estimate: math.Float64frombits(binary.BigEndian.Uint64(b[10:])),
		Interval: math.Float64frombits(binary.BigEndian.Uint64(b[18:])),
	}
	if r.Step < 0 {
		return StepReply{}, fmt.Errorf("%w: negative step %d", ErrMalformed, r.Step)
	}
	if err := checkFloat("estimate", r.Estimate); err != nil {
		return StepReply{}, err
	}
	if err := checkFloat("interval", r.Interval); err != nil {
		return StepReply{}, err
	}
	return r, nil
}
