package node

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/pspnode/pspnode/psp"
)

// Wire formats of the step and model protocols.
//
// Every message is a frame: a uvarint length, then that many bytes of body.
// Every body starts with a version byte (wireVersion); a peer that sees
// another version rejects the message. Integers and floats are big-endian,
// fixed width. Frames larger than the protocol's cap are rejected before
// anything is allocated, so a hostile peer cannot make a node allocate more
// than the cap.
//
// Step protocol /psp/<job>/step/1.0.0, request and reply frames taking
// turns; a stream carries one exchange or, reused, several (stepconn.go):
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
const wireVersion = 1

const (
	kindQuery   = 1
	kindLeaving = 2
)

const (
	stepRequestLen = 1 + 1 + 8 + 8
	stepReplyLen   = 1 + 1 + 8 + 8 + 8
	maxStepFrame   = 64
	modelHeaderLen = 1 + 8 + 4 + 4
)

// ErrWire is wrapped by every decoding error of the node's protocols.
var ErrWire = errors.New("malformed message")

// StepRequest is what a node sends when it asks a peer for its step.
type StepRequest struct {
	Leaving  bool     // the sender is leaving the job; no reply is expected
	Step     psp.Step // the sender's step
	Estimate float64  // the sender's population estimate, 0 if none
	// Ext is what a request of step protocol 1.1.0 carries beyond the
	// 1.0.0 body (stepext.go): nil for a 1.0.0 request. MarshalStepRequest
	// leaves it out; MarshalStepRequestExt sends it.
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

func writeFrame(w io.Writer, body []byte) error {
	var hdr [binary.MaxVarintLen64]byte
	n := binary.PutUvarint(hdr[:], uint64(len(body)))
	if _, err := w.Write(append(hdr[:n:n], body...)); err != nil {
		return err
	}
	return nil
}

// smallReader reads one frame of at most limit bytes from r, through a
// buffer just big enough for it: the default 4 KiB buffer of bufio, for
// every step query on both sides, was a tenth of all allocation in a
// 200-node testnet.
func smallReader(r io.Reader, limit int) *bufio.Reader {
	n := limit + binary.MaxVarintLen64
	return bufio.NewReaderSize(io.LimitReader(r, int64(n)), n)
}

func readFrame(r *bufio.Reader, limit int) ([]byte, error) {
	n, err := readFrameLen(r, limit)
	if err != nil {
		return nil, err
	}
	return readBody(r, n)
}

// readFrameLen reads a frame's length prefix and checks it against limit.
func readFrameLen(r *bufio.Reader, limit int) (int, error) {
	n, err := binary.ReadUvarint(r)
	if err != nil {
		return 0, fmt.Errorf("%w: length: %w", ErrWire, err)
	}
	if n > uint64(limit) {
		return 0, fmt.Errorf("%w: frame of %d bytes exceeds the cap of %d", ErrWire, n, limit)
	}
	return int(n), nil
}

// readBody reads the n bytes of a frame's body. A large body's buffer grows
// as its bytes arrive, so a peer that declares a large frame and sends
// nothing makes this node hold nothing for it.
func readBody(r io.Reader, n int) ([]byte, error) {
	const eager = 64 << 10
	if n <= eager {
		b := make([]byte, n)
		if _, err := io.ReadFull(r, b); err != nil {
			return nil, fmt.Errorf("%w: body: %w", ErrWire, err)
		}
		return b, nil
	}
	b, err := io.ReadAll(io.LimitReader(r, int64(n)))
	if err == nil && len(b) < n {
		err = io.ErrUnexpectedEOF
	}
	if err != nil {
		return nil, fmt.Errorf("%w: body: %w", ErrWire, err)
	}
	return b, nil
}

func checkFloat(name string, v float64) error {
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return fmt.Errorf("%w: %s %v is not a finite non-negative number", ErrWire, name, v)
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
	b = append(b, wireVersion, kind)
	b = binary.BigEndian.AppendUint64(b, uint64(q.Step))
	return binary.BigEndian.AppendUint64(b, math.Float64bits(q.Estimate))
}

// UnmarshalStepRequest decodes and checks a request body.
func UnmarshalStepRequest(b []byte) (StepRequest, error) {
	if len(b) != stepRequestLen {
		return StepRequest{}, fmt.Errorf("%w: step request of %d bytes, want %d", ErrWire, len(b), stepRequestLen)
	}
	if b[0] != wireVersion {
		return StepRequest{}, fmt.Errorf("%w: step request version %d, want %d", ErrWire, b[0], wireVersion)
	}
	if b[1] != kindQuery && b[1] != kindLeaving {
		return StepRequest{}, fmt.Errorf("%w: step request kind %d", ErrWire, b[1])
	}
	q := StepRequest{
		Leaving:  b[1] == kindLeaving,
		Step:     psp.Step(binary.BigEndian.Uint64(b[2:])),
		Estimate: math.Float64frombits(binary.BigEndian.Uint64(b[10:])),
	}
	if q.Step < 0 {
		return StepRequest{}, fmt.Errorf("%w: negative step %d", ErrWire, q.Step)
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
	b = append(b, wireVersion, flags)
	b = binary.BigEndian.AppendUint64(b, uint64(r.Step))
	b = binary.BigEndian.AppendUint64(b, math.Float64bits(r.Estimate))
	return binary.BigEndian.AppendUint64(b, math.Float64bits(r.Interval))
}

// UnmarshalStepReply decodes and checks a reply body.
func UnmarshalStepReply(b []byte) (StepReply, error) {
	if len(b) != stepReplyLen {
		return StepReply{}, fmt.Errorf("%w: step reply of %d bytes, want %d", ErrWire, len(b), stepReplyLen)
	}
	if b[0] != wireVersion {
		return StepReply{}, fmt.Errorf("%w: step reply version %d, want %d", ErrWire, b[0], wireVersion)
	}
	if b[1]&^1 != 0 {
		return StepReply{}, fmt.Errorf("%w: step reply flags %#x", ErrWire, b[1])
	}
	r := StepReply{
		Leaving:  b[1]&1 != 0,
		Step:     psp.Step(binary.BigEndian.Uint64(b[2:])),
		Estimate: math.Float64frombits(binary.BigEndian.Uint64(b[10:])),
		Interval: math.Float64frombits(binary.BigEndian.Uint64(b[18:])),
	}
	if r.Step < 0 {
		return StepReply{}, fmt.Errorf("%w: negative step %d", ErrWire, r.Step)
	}
	if err := checkFloat("estimate", r.Estimate); err != nil {
		return StepReply{}, err
	}
	if err := checkFloat("interval", r.Interval); err != nil {
		return StepReply{}, err
	}
	return r, nil
}

// ModelSnapshot is a model transferred to a joining node.
type ModelSnapshot struct {
	Step    psp.Step
	ModelID uint32
	Params  []float64
}

// ModelMismatchError says that a peer runs another model than this node:
// another model ID or parameter count. It is not a malformed message: the
// two nodes must not be in one job.
type ModelMismatchError struct {
	Peer       string // the peer's ID; "" when not known
	PeerModel  uint32
	PeerParams int64
	OwnModel   uint32
	OwnParams  int64
}

func (e *ModelMismatchError) Error() string {
	who := "the peer"
	if e.Peer != "" {
		who = "peer " + e.Peer
	}
	return fmt.Sprintf("model mismatch: %s runs model id %#08x with %d parameters; this node runs model id %#08x with %d",
		who, e.PeerModel, e.PeerParams, e.OwnModel, e.OwnParams)
}

// MaxModelFrame is the largest model reply accepted for n parameters.
func MaxModelFrame(n int) int { return modelHeaderLen + 8*n }

// MarshalModel encodes a model reply body.
func MarshalModel(m ModelSnapshot) []byte {
	b := make([]byte, modelHeaderLen+8*len(m.Params))
	b[0] = wireVersion
	binary.BigEndian.PutUint64(b[1:], uint64(m.Step))
	binary.BigEndian.PutUint32(b[9:], m.ModelID)
	binary.BigEndian.PutUint32(b[13:], uint32(len(m.Params)))
	for i, v := range m.Params {
		binary.BigEndian.PutUint64(b[modelHeaderLen+8*i:], math.Float64bits(v))
	}
	return b
}

// UnmarshalModel decodes a model reply body and verifies it against what
// the receiver runs: the model id, the parameter count, and that every
// parameter is finite.
func UnmarshalModel(b []byte, modelID uint32, n int) (ModelSnapshot, error) {
	if len(b) < modelHeaderLen {
		return ModelSnapshot{}, fmt.Errorf("%w: model reply of %d bytes is shorter than its header", ErrWire, len(b))
	}
	if b[0] != wireVersion {
		return ModelSnapshot{}, fmt.Errorf("%w: model reply version %d, want %d", ErrWire, b[0], wireVersion)
	}
	m := ModelSnapshot{
		Step:    psp.Step(binary.BigEndian.Uint64(b[1:])),
		ModelID: binary.BigEndian.Uint32(b[9:]),
	}
	count := binary.BigEndian.Uint32(b[13:])
	switch {
	case m.Step < 0:
		return ModelSnapshot{}, fmt.Errorf("%w: negative step %d", ErrWire, m.Step)
	case m.ModelID != modelID || int64(count) != int64(n):
		return ModelSnapshot{}, &ModelMismatchError{PeerModel: m.ModelID, PeerParams: int64(count), OwnModel: modelID, OwnParams: int64(n)}
	case len(b) != modelHeaderLen+8*n:
		return ModelSnapshot{}, fmt.Errorf("%w: model reply of %d bytes, want %d", ErrWire, len(b), modelHeaderLen+8*n)
	}
	m.Params = make([]float64, n)
	for i := range m.Params {
		v := math.Float64frombits(binary.BigEndian.Uint64(b[modelHeaderLen+8*i:]))
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return ModelSnapshot{}, fmt.Errorf("%w: parameter %d is %v", ErrWire, i, v)
		}
		m.Params[i] = v
	}
	return m, nil
}
