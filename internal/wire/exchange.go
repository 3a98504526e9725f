package wire

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"math"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pspnode/pspnode/internal/f32"
)

// The exchange message: an epidemic node's model, sent to a peer in
// blocks, after an offer the peer may refuse (see the package comment for
// the layout). This file holds its framing, its replies' statuses, and how
// a stream carries it: SendModel sends, ExchangeServer takes in.
//
// Why an offer first: a receiver that would refuse a model (the sender
// has sent its share this round, it is on another lineage, the round is
// full) says so before the model's bytes flow, which for a model of 10 M
// parameters is 40 MB of upload not thrown away. Why blocks: the receiver
// judges and takes each block as it comes (ExchangeJudge.Block), so it
// holds a block per receive in flight, never a whole model, and a sender
// reads each block from its model as it sends it, so that a model that
// waited for a slow link goes out as it is when the link frees.

// ExchangeVersion is the first byte of every exchange message body. (The
// exchange protocol's 1.0.0, one frame holding a whole model, is not
// served: a receiver held every model it was sent whole.)
const ExchangeVersion = 2

// ExchangeBlock is the values in a block of an exchanged model (1 MiB of
// float32): every node sends and takes models in blocks of this size, the
// last one shorter. A block is what a receiver judges (its values, its
// distance to the receiver's model) and averages at once.
const ExchangeBlock = 1 << 18

// Blocks is the number of ExchangeBlock blocks of a model of n values.
func Blocks(n int) int { return (n + ExchangeBlock - 1) / ExchangeBlock }

// BlockRange is the values [lo, hi) of block b of a model of n values.
func BlockRange(b, n int) (lo, hi int) {
	lo = b * ExchangeBlock
	return lo, min(lo+ExchangeBlock, n)
}

// Reasons a received model is refused, beside those of gossip's validation
// (reason.go): the sender runs another exchange; the model is too
// far from the receiver's; the sender sent more models since the
// receiver's last average than it may; the sender was last heard on
// another lineage of the job; the receiver has no model of its own yet to
// judge it by; a block came out of order or of the wrong size.
const (
	ReasonExchangeMismatch Reason = "exchange_mismatch"
	ReasonDistance         Reason = "distance"
	ReasonRate             Reason = "rate"
	ReasonOtherLineage     Reason = "other_lineage"
	ReasonNoModel          Reason = "no_model"
	ReasonBadBlock         Reason = "bad_block"
)

// exchangeCodes are the reply statuses: the index is the code; 0 means
// taken (or, in a verdict, "send the blocks"). New reasons go at the end.
var exchangeCodes = []Reason{
	"", ReasonExchangeMismatch, ReasonMalformed, ReasonBadVersion, ReasonBadEncoding,
	ReasonSenderMismatch, ReasonModelMismatch, ReasonWrongLength, ReasonNonFinite,
	ReasonValueTooLarge, ReasonNegativeStep, ReasonStepTooFarAhead, ReasonOversize,
	ReasonDistance, ReasonRate, ReasonOtherLineage, ReasonNoModel, ReasonBadBlock, ReasonBadScale,
	ReasonFragmentMismatch, ReasonBadFragment,
}

// ExchangeReasons are the reasons an exchange reply can give for a
// refusal, in the order of their codes.
func ExchangeReasons() []Reason { return exchangeCodes[1:] }

func exchangeCode(r Reason) byte {
	for i, c := range exchangeCodes {
		if c == r {
			return byte(i)
		}
	}
	return 2 // malformed
}

// EncodingFloat32 is an offer's encoding: every value a float32,
// little-endian.
const EncodingFloat32 = 1

// Offer is the head of an exchanged model: what it is, and which of its
// blocks follow.
type Offer struct {
	Kind     byte  // the sender's exchange (1: epidemic)
	Encoding byte  // EncodingFloat32, EncodingBF16, EncodingInt8 or EncodingInt4 (compress.go)
	Step     int64 // the sender's steps when it offered the model
	ModelID  uint32
	N        uint32 // the model's values
	Block    uint32 // values per block (ExchangeBlock)
	First    uint32 // the first block sent
	Count    uint32 // blocks sent, First to First+Count−1, in order
	// Fragment and Fragments: the model is cut into Fragments fragments
	// (0 or 1: none) and this offer is of fragment Fragment, whose blocks
	// First and Count must be (fragment.go).
	Fragment, Fragments uint32
}

// OfferLen is the length of an offer's body.
const OfferLen = 4 + 8 + 5*4

// chunkHeadLen is the head of each block on the stream: its index and
// its count of values.
const chunkHeadLen = 8

const replyLen = 3

// AppendOffer appends o's frame to b: an offer of a fragment when
// o.Fragments > 1 (fragment.go).
func AppendOffer(b []byte, o Offer) []byte {
	frag := o.Fragments > 1
	if frag {
		b = binary.AppendUvarint(b, FragmentOfferLen)
		b = append(b, ExchangeVersion, o.Kind, o.Encoding, 1)
	} else {
		b = binary.AppendUvarint(b, OfferLen)
		b = append(b, ExchangeVersion, o.Kind, o.Encoding, 0)
	}
	b = binary.BigEndian.AppendUint64(b, uint64(o.Step))
	for _, v := range []uint32{o.ModelID, o.N, o.Block, o.First, o.Count} {
		b = binary.BigEndian.AppendUint32(b, v)
	}
	if frag {
		b = appendFragment(b, o)
	}
	return b
}

// ParseOffer decodes an offer's body.
func ParseOffer(body []byte) (Offer, error) {
	want := OfferLen
	if len(body) > 3 && body[3] == 1 {
		want = FragmentOfferLen
	}
	if len(body) != want {
		return Offer{}, fmt.Errorf("%w: exchange offer of %d bytes, want %d", ErrMalformed, len(body), want)
	}
	if body[0] != ExchangeVersion {
		return Offer{}, fmt.Errorf("%w: exchange offer version %d, want %d", ErrMalformed, body[0], ExchangeVersion)
	}
	u := func(i int) uint32 { return binary.BigEndian.Uint32(body[12+4*i:]) }
	o := Offer{Kind: body[1], Encoding: body[2], Step: int64(binary.BigEndian.Uint64(body[4:])),
		ModelID: u(0), N: u(1), Block: u(2), First: u(3), Count: u(4)}
	if want == FragmentOfferLen {
		o.Fragment, o.Fragments = u(5), u(6)
		if o.Fragments < 2 || o.Fragments > MaxFragments {
			return Offer{}, fmt.Errorf("%w: exchange offer of %d fragments, want 2 to %d", ErrMalformed, o.Fragments, MaxFragments)
		}
	}
	return o, nil
}

// Check says what is wrong with an offer for a model of n values and
// model ID id, not cut into fragments, whatever the receiver's state: ""
// when nothing is (CheckLayout for a model cut into fragments).
func (o Offer) Check(id uint32, n int) Reason { return o.CheckLayout(id, Layout{N: n, F: 1}) }

// checkHead is what Check and CheckLayout check of every offer.
func (o Offer) checkHead(id uint32, n int) Reason {
	switch {
	case o.Encoding != EncodingFloat32 && !Compressed(o.Encoding):
		return ReasonBadEncoding
	case o.ModelID != id:
		return ReasonModelMismatch
	case int64(o.N) != int64(n):
		return ReasonWrongLength
	case o.Step < 0:
		return ReasonNegativeStep
	}
	return ""
}

// ExchangeStats are what SendModel reports of one model sent.
type ExchangeStats struct {
	// Offered: the receiver answered the offer; Refused is then its
	// reason ("" when it took the blocks).
	Offered bool
	// Blocks and Bytes are what was sent after the offer (headers
	// included).
	Blocks, Bytes int
}

// SendModel offers a model to p, over h, and sends its blocks if p takes
// them: fill writes block b's values (o.Layout().Range(b): BlockRange(b,
// N) for a whole model) into dst. Each wait, for the verdict, a block's
// write or the final answer, has its own deadline of step (a slow link
// sends a large model in many of them);
// ctx ends the whole. buf is a buffer of a block's values (nil: one is
// made). It returns the reason p refused the model ("" when
// it took it) and p's exchange kind.
func SendModel(ctx context.Context, h host.Host, p peer.ID, job string, o Offer, fill func(b int, dst []float32), buf []float32, step time.Duration) (reason Reason, theirs byte, st ExchangeStats, err error) {
	s, err := h.NewStream(ctx, p, ExchangeProtocol(job))
	if err != nil {
		return "", 0, st, err
	}
	defer Guard(ctx, s)()
	dl := newDeadline(s, step)
	defer dl.stop()
	if _, err := s.Write(AppendOffer(nil, o)); err != nil {
		_ = s.Reset()
		return "", 0, st, err
	}
	r := SmallReader(s, 2*(replyLen+1))
	reason, theirs, err = readReply(r)
	if err != nil {
		_ = s.Reset()
		return "", 0, st, err
	}
	st.Offered = true
	if reason != "" {
		_ = s.Close()
		return reason, theirs, st, nil
	}
	if size := min(int(o.N), ExchangeBlock); cap(buf) < size {
		buf = make([]float32, size)
	}
	var enc []byte // a block's encoding, when not float32
	lay := o.Layout()
	for b := int(o.First); b < int(o.First+o.Count); b++ {
		lo, hi := lay.Range(b)
		v := buf[:hi-lo]
		fill(b, v)
		dl.arm()
		if o.Encoding == EncodingFloat32 {
			err = writeBlock(s, b, v)
		} else {
			enc = encodeValues(appendBlockHead(enc[:0], b, len(v)), o.Encoding, v)
			_, err = s.Write(enc)
		}
		if err != nil {
			_ = s.Reset()
			return "", theirs, st, err
		}
		st.Blocks++
		st.Bytes += chunkHeadLen + EncodedLen(o.Encoding, len(v))
	}
	_ = s.CloseWrite()
	dl.arm()
	reason, theirs, err = readReply(r)
	if err != nil {
		_ = s.Reset()
		return "", theirs, st, err
	}
	_ = s.Close()
	return reason, theirs, st, nil
}

// readReply reads a verdict or a final answer.
func readReply(r *bufio.Reader) (Reason, byte, error) {
	reply, err := ReadFrame(r, replyLen)
	if err == nil && (len(reply) != replyLen || reply[0] != ExchangeVersion || int(reply[1]) >= len(exchangeCodes)) {
		err = fmt.Errorf("%w: exchange reply % x", ErrMalformed, reply)
	}
	if err != nil {
		return "", 0, err
	}
	return exchangeCodes[reply[1]], reply[2], nil
}

// writeReply writes a verdict or a final answer.
func writeReply(w io.Writer, reason Reason, kind byte) error {
	return WriteFrame(w, []byte{ExchangeVersion, exchangeCode(reason), kind})
}

// deadline resets a stream when one wait on it lasts longer than its
// step: a deadline per wait (arm starts the next), on every transport,
// SetDeadline or not.
type deadline struct {
	s    network.Stream
	step time.Duration
	t    *time.Timer
}

func newDeadline(s network.Stream, step time.Duration) *deadline {
	d := &deadline{s: s, step: step}
	d.t = time.AfterFunc(step, func() { _ = s.Reset() })
	_ = s.SetDeadline(time.Now().Add(step))
	return d
}

// arm starts the next wait's deadline.
func (d *deadline) arm() {
	d.t.Reset(d.step)
	_ = d.s.SetDeadline(time.Now().Add(d.step))
}

func (d *deadline) stop() { d.t.Stop() }

// An ExchangeJudge decides whether a node takes a model it is offered,
// and takes its blocks: the node's exchange.
type ExchangeJudge interface {
	// Offer judges an offer from its head alone (checked with
	// Offer.Check): "" to have the blocks sent. A refused model's blocks
	// never flow.
	Offer(from peer.ID, o Offer) Reason
	// Block judges and takes block b of a model whose offer it took:
	// values (o.Layout().Range(b)) are valid only during the call. A refusal
	// ends the transfer; the blocks taken before stay taken.
	Block(from peer.ID, o Offer, b int, values []float32) Reason
	// End is called once for every offer Offer took, when its transfer
	// ends: taken blocks of o.Count came (complete when all did), and
	// reason is why it ended early ("" when it did not). It returns the
	// final answer the sender gets.
	End(from peer.ID, o Offer, taken int, reason Reason) Reason
}

// ExchangeServer takes in models sent by peers.
type ExchangeServer struct {
	Life context.Context // ends when the node closes
	// Timeout bounds each wait on a stream: the offer, each block, the
	// final answer (a large model over a slow link takes many).
	Timeout time.Duration
	Kind    byte // this node's exchange, said in every reply
	ModelID uint32
	N       int // this node's model's values
	// Fragments is how many fragments the node's model is cut into (0 or
	// 1: none): offers of another number are refused.
	Fragments int
	Judge     ExchangeJudge
	// Budget bounds the blocks read at once by all receives (each a
	// buffer of ExchangeBlock values): the bytes a node holds for models
	// on their way in, whatever the number of senders.
	Budget *BlockBudget
	// Rejected counts refusals by reason once a model's blocks began
	// (malformed requests included), Declined those at the offer, before
	// any of its bytes (nil: counted in Rejected).
	Rejected, Declined *prometheus.CounterVec
	Log                *slog.Logger
}

// BlockBudget is a fixed set of block buffers that receives share.
type BlockBudget struct {
	free chan []float32
	size int
}

// NewBlockBudget makes a budget of k block buffers for a model of n
// values: of ExchangeBlock values each, or n when the model is smaller
// (the buffers are made as they are first needed).
func NewBlockBudget(k, n int) *BlockBudget {
	b := &BlockBudget{free: make(chan []float32, k), size: max(1, min(n, ExchangeBlock))}
	for range k {
		b.free <- nil
	}
	return b
}

// get takes a buffer, waiting within ctx.
func (b *BlockBudget) get(ctx context.Context) ([]float32, error) {
	select {
	case v := <-b.free:
		if v == nil {
			v = make([]float32, b.size)
		}
		return v, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (b *BlockBudget) put(v []float32) { b.free <- v }

// Serve takes in one model on s and answers.
func (sv *ExchangeServer) Serve(s network.Stream) {
	from := s.Conn().RemotePeer()
	ctx, cancel := context.WithCancel(sv.Life)
	defer cancel()
	defer Guard(ctx, s)()
	dl := newDeadline(s, sv.Timeout)
	defer dl.stop()
	r := bufio.NewReaderSize(s, 4096)
	body, err := ReadFrame(r, FragmentOfferLen)
	var o Offer
	if err == nil {
		o, err = ParseOffer(body)
	}
	if err != nil {
		sv.refused(ReasonMalformed, from, err)
		_ = s.Reset()
		return
	}
	reason := o.CheckLayout(sv.ModelID, Layout{N: sv.N, F: sv.Fragments})
	if reason == "" {
		reason = sv.Judge.Offer(from, o)
	}
	if reason != "" {
		if sv.Declined != nil {
			sv.Declined.WithLabelValues(string(reason)).Inc()
		} else {
			sv.refused(reason, from, nil)
		}
		if writeReply(s, reason, sv.Kind) == nil {
			_ = s.Close()
		} else {
			_ = s.Reset()
		}
		return
	}
	if err := writeReply(s, "", sv.Kind); err != nil {
		sv.Judge.End(from, o, 0, ReasonMalformed)
		_ = s.Reset()
		return
	}
	taken, why, read := sv.blocks(ctx, s, r, dl, from, o)
	final := sv.Judge.End(from, o, taken, why)
	if why != "" {
		sv.refused(why, from, nil)
		if !read {
			_ = s.Reset() // the rest of the model is not wanted
			return
		}
		// Refused at its last block: nothing is left to flow, and the
		// sender learns why.
	}
	dl.arm()
	if err := writeReply(s, final, sv.Kind); err != nil {
		_ = s.Reset()
		return
	}
	_ = s.Close()
}

// blocks reads the blocks of an offer it took, one at a time, into a
// buffer of the budget, and has the judge take each: it returns how many
// it took, why it stopped early ("" when it did not), and whether every
// byte of the model was read.
func (sv *ExchangeServer) blocks(ctx context.Context, s network.Stream, r *bufio.Reader, dl *deadline, from peer.ID, o Offer) (int, Reason, bool) {
	var head [chunkHeadLen]byte
	lay := o.Layout()
	for i := range int(o.Count) {
		b := int(o.First) + i
		lo, hi := lay.Range(b)
		dl.arm()
		if _, err := io.ReadFull(r, head[:]); err != nil {
			sv.Log.Debug("exchange block not received", "from", from, "block", b, "err", err)
			return i, ReasonMalformed, false
		}
		if int(binary.BigEndian.Uint32(head[0:])) != b || int(binary.BigEndian.Uint32(head[4:])) != hi-lo {
			return i, ReasonBadBlock, false // its values are not read
		}
		bctx, cancel := context.WithTimeout(ctx, sv.Timeout)
		buf, err := sv.Budget.get(bctx)
		cancel()
		if err != nil {
			return i, ReasonMalformed, false
		}
		v := buf[:hi-lo]
		dl.arm()
		var reason Reason
		if o.Encoding == EncodingFloat32 {
			err = readFloats(r, v)
		} else {
			reason, err = readValues(r, o.Encoding, v)
		}
		if err != nil {
			sv.Budget.put(buf)
			sv.Log.Debug("exchange block truncated", "from", from, "block", b, "err", err)
			return i, ReasonMalformed, false
		}
		if reason != "" { // a bad scale: the rest of the block is not read
			sv.Budget.put(buf)
			return i, reason, false
		}
		reason = sv.Judge.Block(from, o, b, v)
		sv.Budget.put(buf)
		if reason != "" {
			return i, reason, i == int(o.Count)-1
		}
	}
	return int(o.Count), "", true
}

// writeBlock writes block b, its head and its values v, to w: the values
// as they lie in memory on a little-endian CPU (no copy), else converted.
func writeBlock(w io.Writer, b int, v []float32) error {
	var head [chunkHeadLen]byte
	appendBlockHead(head[:0], b, len(v))
	if !f32.LittleEndian {
		_, err := w.Write(f32.Append(head[:], v))
		return err
	}
	if _, err := w.Write(head[:]); err != nil {
		return err
	}
	_, err := w.Write(f32.Bytes(v))
	return err
}

// appendBlockHead appends block b's head, its index and its n values, to
// dst.
func appendBlockHead(dst []byte, b, n int) []byte {
	dst = binary.BigEndian.AppendUint32(dst, uint32(b))
	return binary.BigEndian.AppendUint32(dst, uint32(n))
}

// readFloats reads len(v) little-endian float32 values into v.
func readFloats(r io.Reader, v []float32) error {
	if f32.LittleEndian {
		_, err := io.ReadFull(r, f32.Bytes(v))
		return err
	}
	var w [4]byte
	for i := range v {
		if _, err := io.ReadFull(r, w[:]); err != nil {
			return err
		}
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(w[:]))
	}
	return nil
}

func (sv *ExchangeServer) refused(reason Reason, from peer.ID, err error) {
	sv.Rejected.WithLabelValues(string(reason)).Inc()
	if err != nil {
		sv.Log.Debug("exchange request malformed", "from", from, "err", err)
	}
}
