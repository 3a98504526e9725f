package wire

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pspnode/pspnode/internal/f32"
	"github.com/pspnode/pspnode/psp"
)

// The model message: a joiner's "send me blocks of your model" and the
// answer (see the package comment for the layout). This file holds its
// codec and how a stream carries it: FetchBlocks and PeekModel ask,
// ModelServer answers.
//
// A model goes in the exchange's blocks (ExchangeBlock values, float32),
// any range of them per request: a joiner fetches the ranges of a large
// model from several peers at once, and fetches a range again from another
// peer when a stream breaks, so nothing it has is fetched twice. The
// answer's head (step, model id, parameter count) comes first, so that a
// model of another shape is found from the head whatever its size, and a
// peek (no blocks asked for) reads nothing more.

// ModelVersion is the first byte of every model message body. (The model
// protocol's 1.0.0, the whole model in one frame of float64, is not
// served: a joiner held a model twice in float64 before it had it.)
const ModelVersion = 2

// ModelRequestLen and ModelHeaderLen are the lengths of a model request's
// body and of the reply's head's: version, then first block and count;
// version, step, model id, parameter count and values per block.
const (
	ModelRequestLen = 1 + 4 + 4
	ModelHeaderLen  = 1 + 8 + 4 + 4 + 4
)

// ModelShape is what a model is, as peers compare it: its architecture's
// id and its parameter count.
type ModelShape struct {
	ID uint32
	N  int
}

// ErrModelMismatch is wrapped by the error for a reply of another model
// than the reader's (a *ModelMismatch). It is not a malformed message:
// the two nodes must not be in one job.
var ErrModelMismatch = errors.New("model mismatch")

// ModelMismatch says that a peer's model reply is of another model than
// the reader's.
type ModelMismatch struct{ Theirs, Ours ModelShape }

func (e *ModelMismatch) Error() string {
	return fmt.Sprintf("%v: the peer runs model id %#08x with %d parameters; the receiver runs model id %#08x with %d",
		ErrModelMismatch, e.Theirs.ID, e.Theirs.N, e.Ours.ID, e.Ours.N)
}

func (e *ModelMismatch) Unwrap() error { return ErrModelMismatch }

// AppendModelRequest appends the frame of a request for count blocks from
// first (count 0: the head alone) to b.
func AppendModelRequest(b []byte, first, count int) []byte {
	b = binary.AppendUvarint(b, ModelRequestLen)
	b = append(b, ModelVersion)
	b = binary.BigEndian.AppendUint32(b, uint32(first))
	return binary.BigEndian.AppendUint32(b, uint32(count))
}

// AppendModelHead appends the frame of a reply's head to b.
func AppendModelHead(b []byte, step psp.Step, shape ModelShape) []byte {
	b = binary.AppendUvarint(b, ModelHeaderLen)
	b = append(b, ModelVersion)
	b = binary.BigEndian.AppendUint64(b, uint64(step))
	b = binary.BigEndian.AppendUint32(b, shape.ID)
	b = binary.BigEndian.AppendUint32(b, uint32(shape.N))
	return binary.BigEndian.AppendUint32(b, ExchangeBlock)
}

// ReadModelHead reads the head of a model reply and checks it against
// ours, the reader's model: a reply of another shape is a
// *ModelMismatch. It returns the answerer's step.
func ReadModelHead(r *bufio.Reader, ours ModelShape) (psp.Step, error) {
	body, err := ReadFrame(r, ModelHeaderLen)
	if err != nil {
		return 0, err
	}
	if len(body) != ModelHeaderLen || body[0] != ModelVersion {
		return 0, fmt.Errorf("%w: model reply head of %d bytes, version %d", ErrMalformed, len(body), body[0])
	}
	step := psp.Step(binary.BigEndian.Uint64(body[1:]))
	theirs := ModelShape{ID: binary.BigEndian.Uint32(body[9:]), N: int(binary.BigEndian.Uint32(body[13:]))}
	switch {
	case step < 0 || step > psp.MaxStep:
		return 0, fmt.Errorf("%w: step %d outside 0 to %d", ErrMalformed, step, psp.MaxStep)
	case theirs != ours:
		return 0, &ModelMismatch{Theirs: theirs, Ours: ours}
	case binary.BigEndian.Uint32(body[17:]) != ExchangeBlock:
		return 0, fmt.Errorf("%w: blocks of %d values, want %d", ErrMalformed, binary.BigEndian.Uint32(body[17:]), ExchangeBlock)
	}
	return step, nil
}

// FetchBlocks asks p, over h, for count blocks of its model from first,
// and reads them into dst (the whole model: ours.N values), each checked:
// every value finite and, if maxAbs > 0, within ±maxAbs (no honest model
// has one beyond the exchange's bound). Each wait, for the head or a
// block, has a deadline of wait; ctx ends the whole. It returns p's step
// and how many blocks it took before it stopped (all of them when err is
// nil): a caller fetches the rest from another peer.
func FetchBlocks(ctx context.Context, h host.Host, p peer.ID, job string, ours ModelShape, first, count int, dst []float32, maxAbs float64, wait time.Duration) (step psp.Step, taken int, err error) {
	if first < 0 || count < 0 || first+count > Blocks(ours.N) || len(dst) != ours.N {
		return 0, 0, fmt.Errorf("blocks %d to %d of a model of %d blocks, into %d values", first, first+count, Blocks(ours.N), len(dst))
	}
	s, err := h.NewStream(ctx, p, ModelProtocol(job))
	if err != nil {
		return 0, 0, err
	}
	defer Guard(ctx, s)()
	dl := newDeadline(s, wait)
	defer dl.stop()
	if _, err := s.Write(AppendModelRequest(nil, first, count)); err != nil {
		_ = s.Reset()
		return 0, 0, err
	}
	_ = s.CloseWrite()
	step, taken, err = readModelReply(bufio.NewReaderSize(s, 64<<10), ours, first, count, dst, 0, maxAbs, dl.arm)
	if err != nil {
		_ = s.Reset()
		return step, taken, err
	}
	_ = s.Close()
	return step, count, nil
}

// FetchBlock asks p, over h, for block b of its model alone, and reads it
// into dst (the block's values: BlockRange(b, ours.N)), checked as
// FetchBlocks checks: a witness's copy of one block, to compare with what
// another peer served, without a second whole model in memory.
func FetchBlock(ctx context.Context, h host.Host, p peer.ID, job string, ours ModelShape, b int, dst []float32, maxAbs float64, wait time.Duration) (psp.Step, error) {
	lo, hi := BlockRange(b, ours.N)
	if b < 0 || b >= Blocks(ours.N) || len(dst) != hi-lo {
		return 0, fmt.Errorf("block %d of a model of %d blocks, into %d values", b, Blocks(ours.N), len(dst))
	}
	s, err := h.NewStream(ctx, p, ModelProtocol(job))
	if err != nil {
		return 0, err
	}
	defer Guard(ctx, s)()
	dl := newDeadline(s, wait)
	defer dl.stop()
	if _, err := s.Write(AppendModelRequest(nil, b, 1)); err != nil {
		_ = s.Reset()
		return 0, err
	}
	_ = s.CloseWrite()
	step, _, err := readModelReply(bufio.NewReaderSize(s, 64<<10), ours, b, 1, dst, lo, maxAbs, dl.arm)
	if err != nil {
		_ = s.Reset()
		return step, err
	}
	_ = s.Close()
	return step, nil
}

// readModelReply reads a reply to a request for count blocks from first:
// its head (checked against ours), then the blocks into dst (the model's
// values from base: the whole model, or one block), each checked (see
// FetchBlocks); arm starts each block's wait.
func readModelReply(r *bufio.Reader, ours ModelShape, first, count int, dst []float32, base int, maxAbs float64, arm func()) (step psp.Step, taken int, err error) {
	if step, err = ReadModelHead(r, ours); err != nil {
		return 0, 0, err
	}
	limit := f32.Limit(maxFloat32)
	if maxAbs > 0 {
		limit = f32.Limit(float32(min(maxAbs, maxFloat32)))
	}
	var head [chunkHeadLen]byte
	for i := range count {
		b := first + i
		lo, hi := BlockRange(b, ours.N)
		arm()
		if _, err := io.ReadFull(r, head[:]); err != nil {
			return step, i, fmt.Errorf("%w: block %d: %w", ErrMalformed, b, err)
		}
		if int(binary.BigEndian.Uint32(head[0:])) != b || int(binary.BigEndian.Uint32(head[4:])) != hi-lo {
			return step, i, fmt.Errorf("%w: block %d of %d values came as block %d of %d", ErrMalformed, b, hi-lo,
				binary.BigEndian.Uint32(head[0:]), binary.BigEndian.Uint32(head[4:]))
		}
		if lo < base || hi-base > len(dst) {
			return step, i, fmt.Errorf("block %d of values [%d, %d) beyond the %d values from %d asked for", b, lo, hi, len(dst), base)
		}
		v := dst[lo-base : hi-base]
		if err := readFloats(r, v); err != nil {
			return step, i, fmt.Errorf("%w: block %d: %w", ErrMalformed, b, err)
		}
		if j, x := f32.First(v, limit); j >= 0 {
			return step, i, fmt.Errorf("%w: parameter %d is %v, not finite or beyond the exchange's bound of ±%v", ErrMalformed, lo+j, x, maxAbs)
		}
	}
	return step, count, nil
}

// maxFloat32 is the largest finite float32.
const maxFloat32 = 3.4028234663852886e38

// PeekModel asks p for the head of its model's reply alone: p's step if
// it runs ours, a *ModelMismatch if it runs another, or why p did not say.
// ctx must carry a deadline.
func PeekModel(ctx context.Context, h host.Host, p peer.ID, job string, ours ModelShape) (psp.Step, error) {
	s, err := h.NewStream(ctx, p, ModelProtocol(job))
	if err != nil {
		return 0, err
	}
	defer s.Reset() // nothing more is wanted
	defer Guard(ctx, s)()
	deadline, _ := ctx.Deadline()
	_ = s.SetDeadline(deadline)
	if _, err := s.Write(AppendModelRequest(nil, 0, 0)); err != nil {
		return 0, err
	}
	_ = s.CloseWrite()
	return ReadModelHead(bufio.NewReaderSize(s, 64), ours)
}

// blockBufs are the block buffers model streams serve from.
var blockBufs = sync.Pool{New: func() any { b := make([]float32, ExchangeBlock); return &b }}

// A ModelSource is what ServeModel serves: the node's model.
type ModelSource interface {
	// ModelHead is the step and shape of the model to serve; ok is
	// false when there is none to serve now (the asker tries another
	// peer).
	ModelHead() (step psp.Step, shape ModelShape, ok bool)
	// ReadModel writes the values [lo, hi) of its model into dst, within
	// ctx (a trainer in another process may take a while to give them).
	ReadModel(ctx context.Context, lo, hi int, dst []float32) error
}

// ModelServer answers model requests.
type ModelServer struct {
	Life context.Context // ends when the node closes
	// Timeout bounds each wait on a stream: the request, the source's
	// first values, each block's write.
	Timeout time.Duration
	Source  ModelSource
	// Budget, if set, bounds the model bytes served a minute (see
	// ModelPeerBudget); a request beyond it is reset before any block.
	Budget *ByteBudget
	// Bad counts malformed requests; None the requests reset for want of
	// a model to give; Over those over the budget.
	Bad, None, Over prometheus.Counter
	Log             *slog.Logger
}

// ModelPeerBudget and ModelAllBudget are the models a node serves a
// minute over the model protocol, to one peer and to all (a model counts
// at least modelBudgetUnit bytes): a joiner takes one model, in ranges from
// up to four peers, so a peer that asks for more is asking again and
// again, and a 9-byte request can make the node send at most
// ModelPeerBudget models a minute.
const (
	ModelPeerBudget = 4
	ModelAllBudget  = 16
	modelBudgetUnit = 1 << 20
)

// NewModelBudget is the model protocol's budget.
func NewModelBudget() *ByteBudget { return NewByteBudget(ModelPeerBudget, ModelAllBudget) }

// modelBytes is what blocks [first, first+count) of a model of n values
// take on the wire.
func modelBytes(first, count, n int) uint64 {
	var b uint64
	for i := first; i < first+count; i++ {
		lo, hi := BlockRange(i, n)
		b += uint64(chunkHeadLen + 4*(hi-lo))
	}
	return b
}

// Serve answers one model request on s: the head, then the blocks asked
// for, each read from the source as it goes out.
func (sv *ModelServer) Serve(s network.Stream) {
	defer s.Close()
	ctx, cancel := context.WithCancel(sv.Life)
	defer cancel()
	defer Guard(ctx, s)()
	dl := newDeadline(s, sv.Timeout)
	defer dl.stop()
	body, err := ReadFrame(SmallReader(s, ModelRequestLen), ModelRequestLen)
	if err != nil || len(body) != ModelRequestLen || body[0] != ModelVersion {
		inc(sv.Bad)
		_ = s.Reset()
		return
	}
	first, count := int(binary.BigEndian.Uint32(body[1:])), int(binary.BigEndian.Uint32(body[5:]))
	step, shape, ok := sv.Source.ModelHead()
	if !ok {
		inc(sv.None)
		_ = s.Reset()
		return
	}
	if int64(first)+int64(count) > int64(Blocks(shape.N)) {
		inc(sv.Bad)
		_ = s.Reset()
		return
	}
	next := first // the first block not yet written
	if sv.Budget != nil && count > 0 {
		// Charged before any byte goes out; what was not sent is given back.
		p, cost := s.Conn().RemotePeer(), modelBytes(first, count, shape.N)
		if !sv.Budget.Take(p, cost, max(modelBytes(0, Blocks(shape.N), shape.N), modelBudgetUnit), time.Now()) {
			inc(sv.Over)
			_ = s.Reset()
			return
		}
		defer func() { sv.Budget.Settle(p, cost, modelBytes(first, next-first, shape.N)) }()
	}
	if _, err := s.Write(AppendModelHead(nil, step, shape)); err != nil || count == 0 {
		return
	}
	var buf []float32
	if shape.N < ExchangeBlock { // a small model: a buffer of its size
		buf = make([]float32, shape.N)
	} else {
		bp := blockBufs.Get().(*[]float32)
		defer blockBufs.Put(bp)
		buf = *bp
	}
	for b := first; b < first+count; b++ {
		lo, hi := BlockRange(b, shape.N)
		v := buf[:hi-lo]
		dl.arm()
		rctx, rcancel := context.WithTimeout(ctx, sv.Timeout)
		err := sv.Source.ReadModel(rctx, lo, hi, v)
		rcancel()
		if err != nil {
			inc(sv.None)
			sv.Log.Debug("model not served", "to", s.Conn().RemotePeer(), "block", b, "err", err)
			_ = s.Reset()
			return
		}
		dl.arm()
		if err := writeBlock(s, b, v); err != nil {
			_ = s.Reset()
			return
		}
		next = b + 1
	}
}
