package node

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"runtime"
	"testing"
)

func TestFrameCap(t *testing.T) {
	var buf bytes.Buffer
	if err := writeFrame(&buf, make([]byte, 100)); err != nil {
		t.Fatal(err)
	}
	if _, err := readFrame(bufio.NewReader(&buf), 64); !errors.Is(err, ErrWire) {
		t.Errorf("an oversized frame must be refused before reading it, got %v", err)
	}
	buf.Reset()
	_ = writeFrame(&buf, []byte{1, 2, 3})
	if b, err := readFrame(bufio.NewReader(&buf), 64); err != nil || len(b) != 3 {
		t.Errorf("frame: %v %v", b, err)
	}
	if _, err := readFrame(bufio.NewReader(bytes.NewReader([]byte{10, 1})), 64); !errors.Is(err, ErrWire) {
		t.Errorf("truncated frame: %v", err)
	}
}

// A frame that declares a large body and then sends a few bytes makes the
// reader hold about what arrived, not what was declared.
func TestReadFrameGrowsAsBytesArrive(t *testing.T) {
	const declared = 64 << 20
	var in bytes.Buffer
	in.Write(binary.AppendUvarint(nil, declared))
	in.WriteString("only these bytes")
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := readFrame(bufio.NewReader(&in), 2*declared)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrWire) || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("err %v, want a wire error for the short body", err)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > declared/8 {
		t.Errorf("reading a short %d-byte frame allocated %d bytes", declared, got)
	}
}
