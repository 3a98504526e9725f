package node

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/libp2p/go-libp2p/core/protocol"
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
//	1 genesis  16 bytes  the sender's Genesis; absent while it has none
//	2 model     8 bytes  model id u32 | parameter count u32, big-endian;
//	                     absent while the sender's model is not fixed (a
//	                     driven node before its first trainer)
//
// A stepStream (stepconn.go) keeps what each side last sent (say, hear).
//
// A node registers both versions and asks for 1.1.0 first (multistream
// negotiation: identify has usually told it what the peer speaks), so a
// peer that knows only 1.0.0 is still asked and answered in 1.0.0.

const (
	fieldGenesis = 1
	fieldModel   = 2

	genesisLen    = 16
	modelFieldLen = 8
	// maxStepFrameExt caps a 1.1.0 step message: the 1.0.0 body and room
	// for fields this version does not know.
	maxStepFrameExt = 255
)

// StepProtocolExt returns the ID of version 1.1.0 of a job's step protocol.
func StepProtocolExt(job string) protocol.ID { return protocol.ID("/psp/" + job + "/step/1.1.0") }

// Genesis names a lineage of a job. The node that starts a job (it found
// no peer of the job when it began to train) makes one: its clock in Unix
// nanoseconds (8 bytes, big-endian), then 8 random bytes. A node that
// joins takes the genesis of the peers it joined, so every node trained
// from one start shares it. Two groups of nodes of one job that trained
// apart, such as a first node restarted without a way back to its peers,
// have different geneses; when they meet, the group with the older
// genesis (the smaller, compared as 16 big-endian bytes) is the job, and
// the nodes of the other adopt its step and model. The zero Genesis means
// none.
type Genesis [genesisLen]byte

// NewGenesis makes a genesis at now.
func NewGenesis(now time.Time) Genesis {
	var g Genesis
	binary.BigEndian.PutUint64(g[:8], uint64(now.UnixNano()))
	_, _ = rand.Read(g[8:])
	if g.IsZero() { // a clock at the epoch and 8 zero bytes: never in practice
		g[15] = 1
	}
	return g
}

// IsZero reports whether g is none.
func (g Genesis) IsZero() bool { return g == Genesis{} }

// Older reports whether g is a genesis older than h, which may be none.
func (g Genesis) Older(h Genesis) bool {
	return !g.IsZero() && (h.IsZero() || bytes.Compare(g[:], h[:]) < 0)
}

// Time is when g was made, by its maker's clock.
func (g Genesis) Time() time.Time { return time.Unix(0, int64(binary.BigEndian.Uint64(g[:8]))) }

// String is g in hex, "" for none.
func (g Genesis) String() string {
	if g.IsZero() {
		return ""
	}
	return hex.EncodeToString(g[:])
}

// StepExt is what a 1.1.0 step message says of its sender beyond 1.0.0.
type StepExt struct {
	// Genesis is the sender's lineage of the job; zero when it has none
	// (it is still joining, or does not follow lineages).
	Genesis Genesis
	// HasModel says whether the sender's model is fixed; then ModelID and
	// Params are its model id and parameter count (0 and 0 for a node
	// without a model).
	HasModel bool
	ModelID  uint32
	Params   uint32
}

// appendStepExt appends e's fields to b.
func appendStepExt(b []byte, e StepExt) []byte {
	if !e.Genesis.IsZero() {
		b = append(b, fieldGenesis, genesisLen)
		b = append(b, e.Genesis[:]...)
	}
	if e.HasModel {
		b = append(b, fieldModel, modelFieldLen)
		b = binary.BigEndian.AppendUint32(b, e.ModelID)
		b = binary.BigEndian.AppendUint32(b, e.Params)
	}
	return b
}

// stepExtLen is the length of e's fields.
func stepExtLen(e StepExt) int {
	n := 0
	if !e.Genesis.IsZero() {
		n += 2 + genesisLen
	}
	if e.HasModel {
		n += 2 + modelFieldLen
	}
	return n
}

// parseStepExt decodes the fields that follow a 1.1.0 body.
func parseStepExt(b []byte) (StepExt, error) {
	var e StepExt
	last := -1
	for len(b) > 0 {
		if len(b) < 2 {
			return StepExt{}, fmt.Errorf("%w: step message field cut short", ErrWire)
		}
		tag, n := int(b[0]), int(b[1])
		if len(b) < 2+n {
			return StepExt{}, fmt.Errorf("%w: step message field %d of %d bytes, %d left", ErrWire, tag, n, len(b)-2)
		}
		if tag <= last {
			return StepExt{}, fmt.Errorf("%w: step message field %d after field %d", ErrWire, tag, last)
		}
		last = tag
		v := b[2 : 2+n]
		switch tag {
		case fieldGenesis:
			if n != genesisLen {
				return StepExt{}, fmt.Errorf("%w: genesis field of %d bytes, want %d", ErrWire, n, genesisLen)
			}
			copy(e.Genesis[:], v)
			if e.Genesis.IsZero() {
				return StepExt{}, fmt.Errorf("%w: zero genesis field (a sender without one leaves it out)", ErrWire)
			}
		case fieldModel:
			if n != modelFieldLen {
				return StepExt{}, fmt.Errorf("%w: model field of %d bytes, want %d", ErrWire, n, modelFieldLen)
			}
			e.HasModel = true
			e.ModelID = binary.BigEndian.Uint32(v)
			e.Params = binary.BigEndian.Uint32(v[4:])
		}
		b = b[2+n:]
	}
	return e, nil
}

// MarshalStepRequestExt encodes a request body of step protocol 1.1.0:
// the 1.0.0 body, then q.Ext's fields (none if q.Ext is nil).
func MarshalStepRequestExt(q StepRequest) []byte {
	var e StepExt
	if q.Ext != nil {
		e = *q.Ext
	}
	return marshalStepRequestExt(q, e)
}

func marshalStepRequestExt(q StepRequest, e StepExt) []byte {
	b := appendStepRequest(make([]byte, 0, stepRequestLen+stepExtLen(e)), q)
	return appendStepExt(b, e)
}

// UnmarshalStepRequestExt decodes and checks a request body of step
// protocol 1.1.0. The request's Ext is never nil.
func UnmarshalStepRequestExt(b []byte) (StepRequest, error) {
	if len(b) < stepRequestLen {
		return StepRequest{}, fmt.Errorf("%w: step request of %d bytes, want at least %d", ErrWire, len(b), stepRequestLen)
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
// 1.0.0 body, then r.Ext's fields (none if r.Ext is nil).
func MarshalStepReplyExt(r StepReply) []byte {
	var e StepExt
	if r.Ext != nil {
		e = *r.Ext
	}
	return marshalStepReplyExt(r, e)
}

func marshalStepReplyExt(r StepReply, e StepExt) []byte {
	b := appendStepReply(make([]byte, 0, stepReplyLen+stepExtLen(e)), r)
	return appendStepExt(b, e)
}

// UnmarshalStepReplyExt decodes and checks a reply body of step protocol
// 1.1.0. The reply's Ext is never nil.
func UnmarshalStepReplyExt(b []byte) (StepReply, error) {
	if len(b) < stepReplyLen {
		return StepReply{}, fmt.Errorf("%w: step reply of %d bytes, want at least %d", ErrWire, len(b), stepReplyLen)
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
