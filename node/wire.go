package node

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"

	"github.com/pspnode/pspnode/internal/wire"
)

// Frames of the node's protocols: a uvarint length, then that many bytes
// of body. The bodies of the step and model protocols, their versions and
// caps are in package internal/wire; the exchange's are in
// exchangeproto.go.

// wireVersion is the first byte of every body.
const wireVersion = wire.Version

// ErrWire is wrapped by every decoding error of the node's protocols.
var ErrWire = wire.ErrMalformed

func writeFrame(w io.Writer, body []byte) error {
	_, err := w.Write(appendFrame(make([]byte, 0, binary.MaxVarintLen64+len(body)), body))
	return err
}

// appendFrame appends the frame of body to b.
func appendFrame(b, body []byte) []byte {
	return append(binary.AppendUvarint(b, uint64(len(body))), body...)
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
		return 0, &frameError{part: "length", err: err}
	}
	if n > uint64(limit) {
		return 0, fmt.Errorf("%w: frame of %d bytes exceeds the cap of %d", ErrWire, n, limit)
	}
	return int(n), nil
}

// frameError is a frame that could not be read: ErrWire and the reader's
// error. It is built without fmt: every reused step stream ends with one
// (the asker's close), and fmt.Errorf there grew the serving goroutine's
// stack each time, 3.6 % of a 200-node testnet's CPU. Its text is made
// only when asked for.
type frameError struct {
	part string
	err  error
}

func (e *frameError) Error() string   { return ErrWire.Error() + ": " + e.part + ": " + e.err.Error() }
func (e *frameError) Unwrap() []error { return []error{ErrWire, e.err} }

// eagerBody is the largest body readBody allocates at once.
const eagerBody = 64 << 10

// readBody reads the n bytes of a frame's body. A large body's buffer grows
// as its bytes arrive, so a peer that declares a large frame and sends
// nothing makes this node hold nothing for it.
func readBody(r io.Reader, n int) ([]byte, error) {
	if n <= eagerBody {
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
