package wire

import (
	"encoding/binary"
	"fmt"
)

// Step protocol 1.1.0: the messages of 1.0.0, each followed by fields that
// say which lineage of the job (its genesis) and which model the sender
// runs, so that two nodes learn at their first step exchange whether they
// belong together (docs/protocols.md, section 6.12).
//
//	request: the 18-byte body of a 1.0.0 request | fields
//	reply:   the 26-byte body of a 1.0.0 reply | fields
//	field:   tag u8 | length u8 | value (length bytes)
//
// Fields come in increasing order of tag, each at most once, and fill the
// body exactly. A receiver skips a field whose tag it does not know, so a
// later version can add fields without a new protocol ID; a known field of
// another length is malformed. A sender sends all its fields in its first
// message on a stream and again whenever they change, and none otherwise:
// a message without fields repeats what its sender last sent on the
// stream (nothing, if it has sent none), so a reused stream costs what a
// 1.0.0 one does. The fields of this version:
//
//	1 genesis  16 bytes  the sender's genesis; absent while it has none
//	2 model     8 bytes  model id u32 | parameter count u32, big-endian;
//	                     absent while the sender's model is not fixed (a
//	                     driven node before its first trainer)
//	3 notices   4 bytes  staleness bound u32, big-endian: the sender sends
//	                     progress notices (docs/protocols.md, 6.6), and an
//	                     asker whose step minus this bound is above the
//	                     sender's step is told when the sender reaches it;
//	                     absent from a sender that sends none
//
// A node keeps, per stream, what each side last sent (package node,
// stepconn.go).
//
// A node registers both versions and asks for 1.1.0 first (multistream
// negotiation: identify has usually told it what the peer speaks), so a
// peer that knows only 1.0.0 is still asked and answered in 1.0.0.

const (
	fieldGenesis = 1
	fieldModel   = 2
	fieldNotices = 3

	// GenesisLen is the length of a genesis (node.Genesis).
	GenesisLen      = 16
	modelFieldLen   = 8
	noticesFieldLen = 4
	// MaxStepFrameExt caps a 1.1.0 step message: the 1.0.0 body and room
	// for fields this version does not know.
	MaxStepFrameExt = 255
)

// StepExt is what a 1.1.0 step message says of its sender beyond 1.0.0.
type StepExt struct {
	// Genesis is the sender's lineage of the job (node.Genesis); zero
	// when it has none (it is still joining, or does not follow
	// lineages).
	Genesis [GenesisLen]byte
	// HasModel says whether the sender's model is fixed; then ModelID and
	// Params are its model id and parameter count (0 and 0 for a node
	// without a model).
	HasModel bool
	ModelID  uint32
	Params   uint32
	// Notices says whether the sender sends progress notices: a reply
	// whose step is below the request's step minus Staleness promises the
	// asker a notice (a query of the sender's) when the sender reaches
	// that threshold, within the sender's waiter lifetime. Staleness is
	// the bound of the sender's barrier (psp.Spec.BaseStaleness).
	Notices   bool
	Staleness uint32
}

// appendStepExt appends e's fields to b.
func appendStepExt(b []byte, e StepExt) []byte {
	if e.Genesis != [GenesisLen]byte{} {
		b = append(b, fieldGenesis, GenesisLen)
		b = append(b, e.Genesis[:]...)
	}
	if e.HasModel {
		b = append(b, fieldModel, modelFieldLen)
		b = binary.BigEndian.AppendUint32(b, e.ModelID)
		b = binary.BigEndian.AppendUint32(b, e.Params)
	}
	if e.Notices {
		b = append(b, fieldNotices, noticesFieldLen)
		b = binary.BigEndian.AppendUint32(b, e.Staleness)
	}
	return b
}

// stepExtLen is the length of e's fields.
func stepExtLen(e StepExt) int {
	n := 0
	if e.Genesis != [GenesisLen]byte{} {
		n += 2 + GenesisLen
	}
	if e.HasModel {
		n += 2 + modelFieldLen
	}
	if e.Notices {
		n += 2 + noticesFieldLen
	}
	return n
}

// parseStepExt decodes the fields that follow a 1.1.0 body.
func parseStepExt(b []byte) (StepExt, error) {
	var e StepExt
	last := -1
	for len(b) > 0 {
		if len(b) < 2 {
			return StepExt{}, fmt.Errorf("%w: step message field cut short", ErrMalformed)
		}
		tag, n := int(b[0]), int(b[1])
		if len(b) < 2+n {
			return StepExt{}, fmt.Errorf("%w: step message field %d of %d bytes, %d left", ErrMalformed, tag, n, len(b)-2)
		}
		if tag <= last {
			return StepExt{}, fmt.Errorf("%w: step message field %d after field %d", ErrMalformed, tag, last)
		}
		last = tag
		v := b[2 : 2+n]
		switch tag {
		case fieldGenesis:
			if n != GenesisLen {
				return StepExt{}, fmt.Errorf("%w: genesis field of %d bytes, want %d", ErrMalformed, n, GenesisLen)
			}
			copy(e.Genesis[:], v)
			if e.Genesis == [GenesisLen]byte{} {
				return StepExt{}, fmt.Errorf("%w: zero genesis field (a sender without one leaves it out)", ErrMalformed)
			}
		case fieldModel:
			if n != modelFieldLen {
				return StepExt{}, fmt.Errorf("%w: model field of %d bytes, want %d", ErrMalformed, n, modelFieldLen)
			}
			e.HasModel = true
			e.ModelID = binary.BigEndian.Uint32(v)
			e.Params = binary.BigEndian.Uint32(v[4:])
		case fieldNotices:
			if n != noticesFieldLen {
				return StepExt{}, fmt.Errorf("%w: notices field of %d bytes, want %d", ErrMalformed, n, noticesFieldLen)
			}
			e.Notices = true
			e.Staleness = binary.BigEndian.Uint32(v)
		}
		b = b[2+n:]
	}
	return e, nil
}

// MarshalStepRequestExt encodes a request body of step protocol 1.1.0:
// the 1.0.0 body of q, then e's fields (q.Ext is not read).
func MarshalStepRequestExt(q StepRequest, e StepExt) []byte {
	b := appendStepRequest(make([]byte, 0, stepRequestLen+stepExtLen(e)), q)
	return appendStepExt(b, e)
}

// UnmarshalStepRequestExt decodes and checks a request body of step
// protocol 1.1.0. The request's Ext is never nil.
func UnmarshalStepRequestExt(b []byte) (StepRequest, error) {
	if len(b) < stepRequestLen {
		return StepRequest{}, fmt.Errorf("%w: step request of %d bytes, want at least %d", ErrMalformed, len(b), stepRequestLen)
	}
	q, err := UnmarshalStepRequest(b[:stepRequestLen])
	if err != nil {
		return StepRequest{}, err
	}
	e, err := parseStepExt(b[stepRequestLen:])
	if err != nil {
		return StepRequest{}, err
	}
	q.Ext = &e
	return q, nil
}

// MarshalStepReplyExt encodes a reply body of step protocol 1.1.0: the
// 1.0.0 body of r, then e's fields (r.Ext is not read).
func MarshalStepReplyExt(r StepReply, e StepExt) []byte {
	b := appendStepReply(make([]byte, 0, stepReplyLen+stepExtLen(e)), r)
	return appendStepExt(b, e)
}

// UnmarshalStepReplyExt decodes and checks a reply body of step protocol
// 1.1.0. The reply's Ext is never nil.
func UnmarshalStepReplyExt(b []byte) (StepReply, error) {
	if len(b) < stepReplyLen {
		return StepReply{}, fmt.Errorf("%w: step reply of %d bytes, want at least %d", ErrMalformed, len(b), stepReplyLen)
	}
	r, err := UnmarshalStepReply(b[:stepReplyLen])
	if err != nil {
		return StepReply{}, err
	}
	e, err := parseStepExt(b[stepReplyLen:])
	if err != nil {
		return StepReply{}, err
	}
	r.Ext = &e
	return r, nil
}
