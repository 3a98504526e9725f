package wire

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"

	"github.com/libp2p/go-libp2p/core/network"
)

// Version is the first byte of every body.
const Version = 1

// ErrMalformed is wrapped by every decoding error of this package: a
// frame or a body a peer sent that breaks its protocol.
var ErrMalformed = errors.New("malformed message")

// AppendFrame appends the frame of body to b: a uvarint length, then the
// body.
func AppendFrame(b, body []byte) []byte {
	return append(binary.AppendUvarint(b, uint64(len(body))), body...)
}

// WriteFrame writes body to w as one frame.
func WriteFrame(w io.Writer, body []byte) error {
	_, err := w.Write(AppendFrame(make([]byte, 0, binary.MaxVarintLen64+len(body)), body))
	return err
}

// SmallReader reads one frame of at most limit bytes from r, through a
// buffer just big enough for it: the default 4 KiB buffer of bufio, for
// every step query on both sides, was a tenth of all allocation in a
// 200-node testnet.
func SmallReader(r io.Reader, limit int) *bufio.Reader {
	n := limit + binary.MaxVarintLen64
	return bufio.NewReaderSize(io.LimitReader(r, int64(n)), n)
}

// ReadFrame reads one frame of at most limit bytes. A frame whose length
// is over limit is refused before anything is allocated for it.
func ReadFrame(r *bufio.Reader, limit int) ([]byte, error) {
	n, err := ReadFrameLen(r, limit)
	if err != nil {
		return nil, err
	}
	return ReadBody(r, n)
}

// ReadFrameLen reads a frame's length prefix and checks it against limit.
func ReadFrameLen(r *bufio.Reader, limit int) (int, error) {
	n, err := binary.ReadUvarint(r)
	if err != nil {
		return 0, &frameError{part: "length", err: err}
	}
	if n > uint64(limit) {
		return 0, fmt.Errorf("%w: frame of %d bytes exceeds the cap of %d", ErrMalformed, n, limit)
	}
	return int(n), nil
}

// frameError is a frame that could not be read: ErrMalformed and the
// reader's error. It is built without fmt: every reused step stream ends
// with one (the asker's close), and fmt.Errorf there grew the serving
// goroutine's stack each time, 3.6 % of a 200-node testnet's CPU. Its
// text is made only when asked for.
type frameError struct {
	part string
	err  error
}

func (e *frameError) Error() string {
	return ErrMalformed.Error() + ": " + e.part + ": " + e.err.Error()
}
func (e *frameError) Unwrap() []error { return []error{ErrMalformed, e.err} }

// EagerBody is the largest body ReadBody allocates at once.
const EagerBody = 64 << 10

// ReadBody reads the n bytes of a frame's body. A large body's buffer
// grows as its bytes arrive, so a peer that declares a large frame and
// sends nothing makes the reader hold nothing for it.
func ReadBody(r io.Reader, n int) ([]byte, error) {
	if n <= EagerBody {
		b := make([]byte, n)
		if _, err := io.ReadFull(r, b); err != nil {
			return nil, fmt.Errorf("%w: body: %w", ErrMalformed, err)
		}
		return b, nil
	}
	b, err := io.ReadAll(io.LimitReader(r, int64(n)))
	if err == nil && len(b) < n {
		err = io.ErrUnexpectedEOF
	}
	if err != nil {
		return nil, fmt.Errorf("%w: body: %w", ErrMalformed, err)
	}
	return b, nil
}

// IsTimeout reports whether err is a stream's deadline passing.
func IsTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// Guard resets s when ctx ends. Every wait on a stream then has a
// deadline even on transports whose SetDeadline does nothing (go-libp2p's
// mocknet), and whatever the remote does. Call the returned stop when
// done; it reports false if the guard had already reset the stream.
func Guard(ctx context.Context, s network.Stream) (stop func() bool) {
	return context.AfterFunc(ctx, func() { _ = s.Reset() })
}
