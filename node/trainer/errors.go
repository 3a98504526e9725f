package trainer

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/pspnode/pspnode/node"
	nodestatus "github.com/pspnode/pspnode/node/status"
	pb "github.com/pspnode/pspnode/node/trainer/trainerpb"
)

// The trainer API's errors (see Errors in the .proto file): a gRPC status
// whose details hold a google.rpc.ErrorInfo with a reason (an ErrorReason
// value's name without its prefix) and the error's facts as metadata, so
// that a client tells errors apart without reading their messages.

// ErrorDomain is the domain of the trainer API's ErrorInfo.
const ErrorDomain = "trainer.pspnode"

// SessionKey is the metadata key under which every call but Session and
// Status carries its session ID.
const SessionKey = "pspnode-session"

// ReasonOf is an ErrorReason's name in ErrorInfo: without the
// ERROR_REASON_ prefix.
func ReasonOf(r pb.ErrorReason) string { return strings.TrimPrefix(r.String(), "ERROR_REASON_") }

// failure is a status error of code with an ErrorInfo of reason and meta
// (key, value pairs).
func failure(code codes.Code, reason pb.ErrorReason, msg string, meta ...string) error {
	st := status.New(code, msg)
	info := &errdetails.ErrorInfo{Reason: ReasonOf(reason), Domain: ErrorDomain}
	if len(meta) > 0 {
		info.Metadata = make(map[string]string, len(meta)/2)
		for i := 0; i+1 < len(meta); i += 2 {
			info.Metadata[meta[i]] = meta[i+1]
		}
	}
	if d, err := st.WithDetails(info); err == nil {
		st = d
	}
	return st.Err()
}

// failuref is failure with a formatted message and no metadata.
func failuref(code codes.Code, reason pb.ErrorReason, format string, a ...any) error {
	return failure(code, reason, fmt.Sprintf(format, a...))
}

var errNoSession = failure(codes.FailedPrecondition, pb.ErrorReason_ERROR_REASON_NO_SESSION,
	"no such session: it ended (the trainer's Session stream closed) or another trainer's is open; open a new Session")

// toStatus maps the node's errors to gRPC statuses.
func toStatus(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	switch {
	case errors.Is(err, node.ErrStepOrder):
		return failure(codes.OutOfRange, pb.ErrorReason_ERROR_REASON_STEP_ORDER, err.Error())
	case errors.Is(err, node.ErrBadUpdate):
		return failure(codes.InvalidArgument, pb.ErrorReason_ERROR_REASON_BAD_VALUE, err.Error())
	case errors.Is(err, node.ErrClosed):
		return failure(codes.Unavailable, pb.ErrorReason_ERROR_REASON_DAEMON_STOPPING, "the node has left the job or is shutting down")
	case errors.Is(err, node.ErrNoCheckpoint):
		return failure(codes.FailedPrecondition, pb.ErrorReason_ERROR_REASON_NO_CHECKPOINT,
			"checkpoint: this daemon has no checkpoint file: start it with --checkpoint FILE")
	case ctx.Err() != nil:
		return status.FromContextError(ctx.Err()).Err()
	}
	return failure(codes.Internal, pb.ErrorReason_ERROR_REASON_INTERNAL, err.Error())
}

// badTensor is the error of a tensor the daemon cannot read.
func badTensor(err error) error {
	return failure(codes.InvalidArgument, pb.ErrorReason_ERROR_REASON_BAD_TENSOR, err.Error())
}

// jobMismatch is the refusal of a trainer whose model is not the job's
// (mm: what a peer of the job runs).
func jobMismatch(mm *node.ModelMismatchError, h *pb.Hello, n int) error {
	msg := fmt.Sprintf("model mismatch: the job's peer %s runs model id %#08x with %d parameters; this trainer runs %q (model id %#08x) with %d float32 parameters: run the job's model, or use another --job",
		mm.Peer, mm.PeerModel, mm.PeerParams, h.ModelName, h.ModelId, n)
	return failure(codes.FailedPrecondition, pb.ErrorReason_ERROR_REASON_MODEL_MISMATCH, msg,
		"model_name", h.ModelName, "model_id", fmt.Sprintf("%#08x", h.ModelId), "num_params", strconv.Itoa(n),
		"other_model_id", fmt.Sprintf("%#08x", mm.PeerModel), "other_num_params", strconv.FormatInt(mm.PeerParams, 10),
		"peer", mm.Peer)
}

// fixedMismatch is the refusal of a trainer whose model is not the one
// the daemon's first trainer fixed (err says both, from Task.fix).
func (s *Server) fixedMismatch(err error, h *pb.Hello, n int) error {
	name, id, count := s.task.shape()
	return failure(codes.FailedPrecondition, pb.ErrorReason_ERROR_REASON_MODEL_MISMATCH, err.Error(),
		"model_name", h.ModelName, "model_id", fmt.Sprintf("%#08x", h.ModelId), "num_params", strconv.Itoa(n),
		"other_model_name", name, "other_model_id", fmt.Sprintf("%#08x", id), "other_num_params", strconv.Itoa(count),
		"fixed_by", "first trainer")
}

// trainerConnected is the refusal of a second trainer.
func trainerConnected(client string, since time.Duration) error {
	return failure(codes.AlreadyExists, pb.ErrorReason_ERROR_REASON_TRAINER_CONNECTED,
		fmt.Sprintf("this daemon already has a trainer (%s, connected %s ago); one trainer per daemon: start another `pspnode run --trainer` for another trainer",
			client, since.Round(time.Second)),
		"connected_client", client, "connected_for_s", strconv.FormatFloat(since.Seconds(), 'f', 1, 64))
}

// badHello is the refusal of a Hello whose field is wrong.
func badHello(field, format string, a ...any) error {
	return failure(codes.InvalidArgument, pb.ErrorReason_ERROR_REASON_BAD_HELLO, fmt.Sprintf(format, a...), "field", field)
}

// badHelloMax is badHello for a field beyond a bound, which its metadata
// names (max).
func badHelloMax(field string, max uint64, format string, a ...any) error {
	return failure(codes.InvalidArgument, pb.ErrorReason_ERROR_REASON_BAD_HELLO, fmt.Sprintf(format, a...),
		"field", field, "max", strconv.FormatUint(max, 10))
}

// sessionID is the session a call names in its metadata ("" for none).
func sessionID(ctx context.Context) string {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get(SessionKey); len(v) > 0 {
		return v[0]
	}
	return ""
}

// dataTensor is a tensor of the bytes b.
func dataTensor(b []byte) *pb.Tensor { return &pb.Tensor{Carrier: &pb.Tensor_Data{Data: b}} }

// sharedTensor is a tensor in the shared file at off.
func sharedTensor(off int) *pb.Tensor {
	return &pb.Tensor{Carrier: &pb.Tensor_Shared{Shared: &pb.SharedRegion{Offset: uint64(off)}}}
}

// unknownService answers calls to a service this server does not have,
// which a client of the trainer API's version 1 makes.
func unknownService(_ any, stream grpc.ServerStream) error {
	method, _ := grpc.MethodFromServerStream(stream)
	for _, v := range []string{"1", "2"} {
		if strings.HasPrefix(method, "/pspnode.trainer.v"+v+".") {
			return failure(codes.Unimplemented, pb.ErrorReason_ERROR_REASON_API_VERSION,
				fmt.Sprintf("%s: this daemon (pspnode %s) serves the trainer API's version 3 (pspnode.trainer.v3.Trainer), not version %s: upgrade the client (clients/python of the same release)", method, node.Version(), v),
				"api_version", v, "supported", "3")
		}
	}
	return status.Errorf(codes.Unimplemented, "unknown method %s", method)
}

// nodeStatus is the NodeStatus of st.
func nodeStatus(st nodestatus.Status) *pb.NodeStatus {
	ns := &pb.NodeStatus{
		Addrs: st.Addrs, ConnectedPeers: uint32(st.ConnectedPeers),
		PopulationStderr: st.EstimateStderr, PopulationError: st.EstimateError,
		Isolated: st.Isolated, IsolatedSince: st.IsolatedSince, Idle: st.Idle,
		UptimeS: st.UptimeS, StepIntervalS: st.StepIntervalS,
		BarrierChecks: st.BarrierChecks, BarrierPasses: st.BarrierPasses, BarrierWaitS: st.BarrierWaitS,
		Loss: st.Loss, Accuracy: st.Accuracy,
		UpdatesSent: st.UpdatesSent, UpdatesReceived: st.UpdatesReceived, UpdatesRejected: st.UpdatesRejected,
		UpdatesNormRefused: st.UpdatesNormRefused, ReportsScreened: st.ReportsScreened,
		Joined: st.Joined, JoinError: st.JoinError,
		Lineage: st.Lineage, ForksJoined: st.ForksJoined, PeersHeldOut: uint32(st.PeersHeldOut),
		InBytes: st.Traffic.InBytes, OutBytes: st.Traffic.OutBytes,
	}
	if x := st.Exchange; x != nil {
		ns.ModelsAveraged, ns.Averages = x.Averaged, x.Averages
	}
	return ns
}
