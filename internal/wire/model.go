package wire

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pspnode/pspnode/psp"
)

// The model message: a joiner's "send me your model" and the model (see
// the package comment for the layout). This file holds its codec and how
// a stream carries it: FetchModel and PeekModel ask, ServeModel answers.
// A reply is read in two parts, its head (step, model id, parameter
// count) and its parameters, so that a model of another shape is found
// from the head whatever its size, and a peek reads nothing more.

// ModelProtocol returns the ID of a job's model protocol.
func ModelProtocol(job string) protocol.ID { return protocol.ID("/psp/" + job + "/model/1.0.0") }

// ModelHeaderLen is the length of a model reply's body before its
// parameters: version, step, model id and parameter count.
const ModelHeaderLen = 1 + 8 + 4 + 4

// MaxModelFrame is the largest model reply accepted for n parameters.
func MaxModelFrame(n int) int { return ModelHeaderLen + 8*n }

// ModelShape is what a model is, as peers compare it: its architecture's
// id and its parameter count.
type ModelShape struct {
	ID uint32
	N  int
}

// ModelSnapshot is a model transferred to a joining node.
type ModelSnapshot struct {
	Step    psp.Step
	ModelID uint32
	Params  []float64
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

// AppendModelHead appends the start of a model reply frame of count
// parameters to b: the frame's length, then the body up to the
// parameters.
func AppendModelHead(b []byte, step psp.Step, modelID uint32, count int) []byte {
	b = binary.AppendUvarint(b, uint64(MaxModelFrame(count)))
	b = append(b, Version)
	b = binary.BigEndian.AppendUint64(b, uint64(step))
	b = binary.BigEndian.AppendUint32(b, modelID)
	return binary.BigEndian.AppendUint32(b, uint32(count))
}

// AppendModelParams appends the parameters of a model reply to b.
func AppendModelParams(b []byte, params []float64) []byte {
	for _, v := range params {
		b = binary.BigEndian.AppendUint64(b, math.Float64bits(v))
	}
	return b
}

// AppendModelReply appends m's whole reply frame to b.
func AppendModelReply(b []byte, m ModelSnapshot) []byte {
	return AppendModelParams(AppendModelHead(b, m.Step, m.ModelID, len(m.Params)), m.Params)
}

// ReadModelHead reads the head of a model reply, up to its parameters,
// and checks it against ours, the reader's model: a reply of another
// shape is a *ModelMismatch.
func ReadModelHead(r *bufio.Reader, ours ModelShape) (ModelSnapshot, error) {
	size, err := binary.ReadUvarint(r)
	if err != nil {
		return ModelSnapshot{}, fmt.Errorf("%w: model reply length: %w", ErrMalformed, err)
	}
	var head [ModelHeaderLen]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return ModelSnapshot{}, fmt.Errorf("%w: model reply head: %w", ErrMalformed, err)
	}
	if head[0] != Version {
		return ModelSnapshot{}, fmt.Errorf("%w: model reply version %d, want %d", ErrMalformed, head[0], Version)
	}
	m := ModelSnapshot{Step: psp.Step(binary.BigEndian.Uint64(head[1:])), ModelID: binary.BigEndian.Uint32(head[9:])}
	count := binary.BigEndian.Uint32(head[13:])
	switch {
	case m.Step < 0:
		return ModelSnapshot{}, fmt.Errorf("%w: negative step %d", ErrMalformed, m.Step)
	case m.ModelID != ours.ID || int64(count) != int64(ours.N):
		return ModelSnapshot{}, &ModelMismatch{Theirs: ModelShape{m.ModelID, int(count)}, Ours: ours}
	case size != uint64(MaxModelFrame(ours.N)):
		return ModelSnapshot{}, fmt.Errorf("%w: model reply of %d bytes for %d parameters", ErrMalformed, size, count)
	}
	return m, nil
}

// ReadModelParams reads the n parameters that follow a model reply's
// head. Each must be finite and, if maxAbs > 0, within ±maxAbs: no honest
// model has one beyond the exchange's bound, which every receiver of
// updates and models holds them to.
func ReadModelParams(r io.Reader, n int, maxAbs float64) ([]float64, error) {
	body, err := ReadBody(r, 8*n)
	if err != nil {
		return nil, err
	}
	params := make([]float64, n)
	for i := range params {
		v := math.Float64frombits(binary.BigEndian.Uint64(body[8*i:]))
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return nil, fmt.Errorf("%w: parameter %d is %v", ErrMalformed, i, v)
		}
		if maxAbs > 0 && math.Abs(v) > maxAbs {
			return nil, fmt.Errorf("%w: parameter %d is %v, beyond the exchange's bound of ±%v", ErrMalformed, i, v, maxAbs)
		}
		params[i] = v
	}
	return params, nil
}

// FetchModel asks p, over h, for its model of job, within ctx, and checks
// it against ours (ReadModelHead, ReadModelParams). ctx must carry a
// deadline.
func FetchModel(ctx context.Context, h host.Host, p peer.ID, job string, ours ModelShape, maxAbs float64) (ModelSnapshot, error) {
	s, err := h.NewStream(ctx, p, ModelProtocol(job))
	if err != nil {
		return ModelSnapshot{}, err
	}
	defer Guard(ctx, s)()
	if err := requestModel(ctx, s); err != nil {
		return ModelSnapshot{}, err
	}
	r := bufio.NewReader(io.LimitReader(s, int64(MaxModelFrame(ours.N))+binary.MaxVarintLen64))
	m, err := ReadModelHead(r, ours)
	if err == nil {
		m.Params, err = ReadModelParams(r, ours.N, maxAbs)
	}
	if err != nil {
		_ = s.Reset()
		return ModelSnapshot{}, err
	}
	_ = s.Close()
	return m, nil
}

// PeekModel asks p for its model and reads only the head of the reply:
// nil if p runs ours, a *ModelMismatch if it runs another, or why p did
// not say. ctx must carry a deadline.
func PeekModel(ctx context.Context, h host.Host, p peer.ID, job string, ours ModelShape) error {
	s, err := h.NewStream(ctx, p, ModelProtocol(job))
	if err != nil {
		return err
	}
	defer s.Reset() // the parameters are not wanted
	defer Guard(ctx, s)()
	if err := requestModel(ctx, s); err != nil {
		return err
	}
	_, err = ReadModelHead(bufio.NewReaderSize(s, 32), ours)
	return err
}

// requestModel sends a model request on s, by ctx's deadline: a frame
// of one byte, the version.
func requestModel(ctx context.Context, s network.Stream) error {
	deadline, _ := ctx.Deadline()
	_ = s.SetDeadline(deadline)
	if err := WriteFrame(s, []byte{Version}); err != nil {
		_ = s.Reset()
		return err
	}
	_ = s.CloseWrite()
	return nil
}

// A ModelSource is what ServeModel serves: the node's model.
type ModelSource interface {
	// ModelHead is the step and shape of the model to serve; ok is
	// false when there is none to serve now (the asker tries another
	// peer).
	ModelHead() (step psp.Step, shape ModelShape, ok bool)
	// ModelParams are its parameters, within ctx: NumParams of them.
	ModelParams(ctx context.Context) ([]float64, error)
}

// ModelServer answers model requests.
type ModelServer struct {
	Life    context.Context // ends when the node closes
	Timeout time.Duration   // bounds one request and its answer
	Source  ModelSource
	// Bad counts malformed requests; None the requests reset for want of
	// a model to give.
	Bad, None prometheus.Counter
	Log       *slog.Logger
}

// Serve answers one model request on s. The reply's head (its length,
// the step, the model id and the parameter count) goes first: an asker
// that only checks which model the job runs (PeekModel) reads it and
// goes, without waiting for the parameters, which a trainer in another
// process may take a while to give.
func (sv *ModelServer) Serve(s network.Stream) {
	defer s.Close()
	ctx, cancel := context.WithTimeout(sv.Life, sv.Timeout)
	defer cancel()
	defer Guard(ctx, s)()
	_ = s.SetDeadline(time.Now().Add(sv.Timeout))
	body, err := ReadFrame(SmallReader(s, 8), 8)
	if err != nil || len(body) != 1 || body[0] != Version {
		inc(sv.Bad)
		_ = s.Reset()
		return
	}
	step, shape, ok := sv.Source.ModelHead()
	if !ok {
		inc(sv.None)
		_ = s.Reset()
		return
	}
	if _, err := s.Write(AppendModelHead(nil, step, shape.ID, shape.N)); err != nil {
		_ = s.Reset()
		return
	}
	params, err := sv.Source.ModelParams(ctx)
	if err == nil && len(params) != shape.N {
		err = fmt.Errorf("the task gave %d parameters, its model has %d", len(params), shape.N)
	}
	if err != nil {
		inc(sv.None)
		sv.Log.Debug("model not served", "to", s.Conn().RemotePeer(), "err", err)
		_ = s.Reset()
		return
	}
	if _, err := s.Write(AppendModelParams(make([]byte, 0, 8*shape.N), params)); err != nil {
		_ = s.Reset()
	}
}
