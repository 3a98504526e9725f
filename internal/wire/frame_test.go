package wire

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"runtime"
	"testing"
	"testing/iotest"
)

func TestFrameCap(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteFrame(&buf, make([]byte, 100)); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadFrame(bufio.NewReader(&buf), 64); !errors.Is(err, ErrMalformed) {
		t.Errorf("an oversized frame must be refused before reading it, got %v", err)
	}
	buf.Reset()
	_ = WriteFrame(&buf, []byte{1, 2, 3})
	if b, err := ReadFrame(bufio.NewReader(&buf), 64); err != nil || len(b) != 3 {
		t.Errorf("frame: %v %v", b, err)
	}
	if _, err := ReadFrame(bufio.NewReader(bytes.NewReader([]byte{10, 1})), 64); !errors.Is(err, ErrMalformed) {
		t.Errorf("truncated frame: %v", err)
	}
}

// A frame whose length does not come says why in the errors it wraps:
// the wire's, and the reader's (a served step stream tells the asker's
// close, io.EOF, and a deadline apart by them).
func TestFrameLengthErrorWraps(t *testing.T) {
	for _, tc := range []struct {
		name string
		r    io.Reader
		want error
	}{
		{"closed", bytes.NewReader(nil), io.EOF},
		{"cut", bytes.NewReader([]byte{0x80}), io.ErrUnexpectedEOF},
		{"deadline", iotest.ErrReader(os.ErrDeadlineExceeded), os.ErrDeadlineExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadFrame(bufio.NewReader(tc.r), 64)
			if !errors.Is(err, ErrMalformed) || !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want it to wrap ErrMalformed and %v", err, tc.want)
			}
			if want := ErrMalformed.Error() + ": length: " + tc.want.Error(); err.Error() != want {
				t.Errorf("text %q, want %q", err.Error(), want)
			}
		})
	}
	if _, err := ReadFrame(bufio.NewReader(iotest.ErrReader(os.ErrDeadlineExceeded)), 64); !IsTimeout(err) {
		t.Errorf("a deadline must read as a timeout: %v", err)
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
	_, err := ReadFrame(bufio.NewReader(&in), 2*declared)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrMalformed) || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("err %v, want a wire error for the short body", err)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > declared/8 {
		t.Errorf("reading a short %d-byte frame allocated %d bytes", declared, got)
	}
}

// Any bytes read as a step frame, under either version's cap, are a frame
// or an ErrMalformed, never a panic or a frame over the cap.
func FuzzReadFrame(f *testing.F) {
	f.Add([]byte{18, 1, 1, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, limit := range []int{MaxStepFrame, MaxStepFrameExt} {
			body, err := ReadFrame(bufio.NewReader(bytes.NewReader(b)), limit)
			if err != nil && !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v is not an ErrMalformed", err)
			}
			if err == nil && len(body) > limit {
				t.Fatalf("a frame of %d bytes over the cap of %d", len(body), limit)
			}
		}
	})
}
