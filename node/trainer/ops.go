package trainer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pspnode/pspnode/internal/f32"
	"github.com/pspnode/pspnode/node"
	pb "github.com/pspnode/pspnode/node/trainer/trainerpb"
)

// The unary calls of a session. Each takes the session's op semaphore,
// so a trainer's calls run one at a time, and runs under a context that
// ends with the call or with the session.

// begin finds the session of a call and takes its semaphore. end must be
// called when the call is over.
func (s *Server) begin(ctx context.Context, id, call string) (sess *session, cctx context.Context, end func(error) error, err error) {
	start := time.Now()
	finish := func(err error) error {
		s.m.calls.WithLabelValues(call).Observe(time.Since(start).Seconds())
		if err != nil {
			s.m.errors.WithLabelValues(call, status.Code(err).String()).Inc()
		}
		return err
	}
	if sess, err = s.active(id); err != nil {
		return nil, nil, nil, finish(err)
	}
	select {
	case sess.op <- struct{}{}:
	case <-ctx.Done():
		return nil, nil, nil, finish(status.FromContextError(ctx.Err()).Err())
	case <-sess.ctx.Done():
		return nil, nil, nil, finish(errNoSession)
	}
	cctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(sess.ctx, cancel)
	return sess, cctx, func(err error) error {
		stop()
		cancel()
		<-sess.op
		return finish(err)
	}, nil
}

// Barrier returns when the node may take req.Step.
func (s *Server) Barrier(ctx context.Context, req *pb.BarrierRequest) (*pb.BarrierReply, error) {
	sess, ctx, end, err := s.begin(ctx, sessionID(ctx), "barrier")
	if err != nil {
		return nil, err
	}
	r, err := sess.barrier(ctx, req.Step)
	return r, end(toStatus(ctx, err))
}

func (sess *session) barrier(ctx context.Context, step int64) (*pb.BarrierReply, error) {
	res, err := sess.srv.drv.Barrier(ctx, step)
	if err != nil {
		return nil, err
	}
	pop, scale := sess.srv.drv.Population()
	return &pb.BarrierReply{Step: step, WaitedS: res.Waited.Seconds(), Checks: uint32(res.Checks), Reason: res.Reason,
		Population: pop, LrScale: scale}, nil
}

// Publish hands the update of a completed step to the exchange.
func (s *Server) Publish(ctx context.Context, req *pb.PublishRequest) (*pb.PublishReply, error) {
	sess, ctx, end, err := s.begin(ctx, sessionID(ctx), "publish")
	if err != nil {
		return nil, err
	}
	x, err := sess.publish(ctx, req.Step, req.Update, req.HasEval, req.Loss, req.Accuracy)
	if err == nil && x != nil { // epidemic: the model becomes the node's and goes to S peers
		err = sess.srv.drv.Push(req.Step, x, nil)
	}
	if err != nil {
		return nil, end(toStatus(ctx, err))
	}
	return &pb.PublishReply{Step: req.Step}, end(nil)
}

// publish checks a step's update, counts the step, and, under gossip,
// hands it to the push loop, which copies it into its message before
// publish returns and then signs and sends it. Under epidemic it returns
// the model (the shared region, or the session's buffer), which the
// caller takes into the node's model: at once (Publish), or with the
// round's average once the barrier has passed (Step). A model refused for
// its values leaves the region holding the model before the step.
func (sess *session) publish(ctx context.Context, step int64, t *pb.Tensor, hasEval bool, loss, acc float64) ([]float32, error) {
	drv := sess.srv.drv
	if err := drv.CheckOrder(step); err != nil {
		return nil, err
	}
	v, err := sess.vector(t, "update")
	if err != nil {
		return nil, badTensor(fmt.Errorf("step %d: %w", step, err))
	}
	bound := f32.Limit(float32(min(drv.Info().MaxAbsValue, maxFloat32)))
	if i, x := f32.First(v, bound); i >= 0 {
		sess.srv.m.refusedUpdates.Inc()
		restored := ""
		if sess.srv.task.epidemic && sess.shm != nil && drv.ReadModel(0, sess.n, v) {
			restored = "; the shared region holds the model before the step"
		}
		return nil, fmt.Errorf("%w: the update of step %d: %s; nothing was published and the step was not counted%s",
			node.ErrBadUpdate, step, describeBad(i, x, drv.Info().MaxAbsValue), restored)
	}
	if hasEval && (math.IsNaN(loss) || math.IsInf(loss, 0) || !(acc >= 0 && acc <= 1 || math.IsNaN(acc))) {
		return nil, failure(codes.InvalidArgument, pb.ErrorReason_ERROR_REASON_BAD_EVALUATION,
			fmt.Sprintf("step %d: evaluation loss %v, accuracy %v: want a finite loss and an accuracy in [0, 1] (NaN for none)", step, loss, acc),
			"step", strconv.FormatInt(step, 10))
	}
	if err := drv.Done(step); err != nil { // Done checks the order again: it fails only if the node's step or barrier moved since CheckOrder
		return nil, err
	}
	if hasEval {
		drv.Evaluated(step, loss, acc)
	}
	if sess.srv.task.epidemic {
		return v, nil
	}
	// The delta is copied into its message before this call goes on (the
	// trainer may write its region again once the call returns, and the
	// pull writes it before), and is signed and sent after.
	p := push{step: step, v: v, copied: make(chan struct{})}
	select {
	case sess.pushes <- p:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	select {
	case <-p.copied:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return nil, nil
}

// describeBad says what is wrong with value i, x, of an update.
func describeBad(i int, x float32, bound float64) string {
	if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
		return fmt.Sprintf("value %d is %v", i, x)
	}
	return fmt.Sprintf("value %d is %v, beyond the bound of ±%v", i, x, bound)
}

// Pull returns the peers' work to merge.
func (s *Server) Pull(ctx context.Context, req *pb.PullRequest) (*pb.PullReply, error) {
	sess, ctx, end, err := s.begin(ctx, sessionID(ctx), "pull")
	if err != nil {
		return nil, err
	}
	return sess.pull(-1, nil), end(nil)
}

// pull is what the trainer takes after a step: a reset, when the daemon
// took the job's step and model; else, under epidemic, its model
// averaged with the round's (with step >= 0, x is the model published at
// step and the average takes it in too, in one pass: Step; else the
// average goes into the session's vector, the model last published:
// Pull); under gossip, the sum of the peers' deltas.
func (sess *session) pull(step int64, x []float32) *pb.PullReply {
	task, drv := sess.srv.task, sess.srv.drv
	if r := drv.TakeReset(); r != nil {
		// The daemon took the job's step and model (another lineage, or
		// it was far ahead of every peer): the trainer takes them in
		// place of its own, and what arrived for its old model goes.
		task.dropPending()
		sess.srv.m.resets.Inc()
		sess.srv.log.Warn("the trainer takes the job's step and parameters", "step", r.Step, "lineage", r.Lineage, "why", r.Reason)
		return &pb.PullReply{Reset_: &pb.Reset{Step: r.Step, Lineage: r.Lineage, Reason: r.Reason, Params: sess.give(r.Params)}}
	}
	var merged int
	if task.epidemic {
		switch {
		case step >= 0:
			merged = drv.Merge(step, x)
		case sess.x != nil && drv.ReadModel(0, 0, nil): // the node holds the trainer's model: it has published one, or took the job's
			x = sess.x
			merged = drv.Merge(-1, x)
		}
	} else {
		x = sess.x
		if x == nil { // no shared file: a buffer for this pull
			x = make([]float32, sess.n)
		}
		var steps []int64
		merged, steps = task.pull(x)
		drv.NoteApplied(steps)
	}
	if merged == 0 {
		return &pb.PullReply{}
	}
	sess.srv.m.merged.Add(float64(merged))
	return &pb.PullReply{Merged: uint32(merged), Update: sess.give(x)}
}

// Step is Publish, Barrier for the next step, and Pull: under epidemic
// the model and the round's average are taken in at once, after the
// barrier.
func (s *Server) Step(ctx context.Context, req *pb.StepRequest) (*pb.StepReply, error) {
	sess, ctx, end, err := s.begin(ctx, sessionID(ctx), "step")
	if err != nil {
		return nil, err
	}
	x, err := sess.publish(ctx, req.Step, req.Update, req.HasEval, req.Loss, req.Accuracy)
	if err != nil {
		return nil, end(toStatus(ctx, err))
	}
	b, err := sess.barrier(ctx, req.Step+1)
	if err != nil {
		if x != nil { // the model still becomes the node's
			err = errors.Join(err, s.drv.Push(req.Step, x, nil))
		}
		return nil, end(toStatus(ctx, err))
	}
	step := int64(-1)
	if x != nil {
		step = req.Step
	}
	return &pb.StepReply{Barrier: b, Pull: sess.pull(step, x)}, end(nil)
}

// Checkpoint writes the trainer's parameters to the daemon's checkpoint:
// the ones it sends, or, under epidemic without them, the node's model
// (the trainer's after its last step).
func (s *Server) Checkpoint(ctx context.Context, req *pb.CheckpointRequest) (*pb.CheckpointReply, error) {
	sess, ctx, end, err := s.begin(ctx, sessionID(ctx), "checkpoint")
	if err != nil {
		return nil, err
	}
	var p []float32 // nil: the node's model (epidemic)
	if req.Params != nil || !s.task.epidemic {
		v, err := sess.tensorOf(req.Params, "parameters", true)
		if err != nil {
			return nil, end(badTensor(err))
		}
		if i, x := f32.First(v, f32.Limit(maxFloat32)); i >= 0 {
			return nil, end(failuref(codes.InvalidArgument, pb.ErrorReason_ERROR_REASON_BAD_VALUE, "checkpoint: %s", describeBad(i, x, maxFloat32)))
		}
		p = v
	}
	path, err := s.drv.Checkpoint(req.Step, p)
	if err != nil {
		return nil, end(toStatus(ctx, err))
	}
	return &pb.CheckpointReply{Path: path, Step: req.Step}, end(nil)
}

// Status reports the daemon's state; it needs no session.
func (s *Server) Status(ctx context.Context, _ *pb.StatusRequest) (*pb.StatusReply, error) {
	st := s.node.Status()
	name, _, n := s.task.shape()
	health := ""
	if err := s.drv.Ready(); err != nil {
		health = err.Error()
	}
	info := s.drv.Info()
	return &pb.StatusReply{
		PeerId: st.PeerID, Job: st.Job, Step: st.Step, Population: st.PopulationEstimate,
		KnownPeers: uint32(st.KnownPeers), Waiting: st.Waiting, Health: health,
		TrainerConnected: st.Trainer != "", TrainerClient: st.Trainer,
		Barrier: st.Barrier, Exchange: info.Exchange.String(), ModelName: name, NumParams: uint64(n),
		Node: nodeStatus(st),
	}, nil
}
