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
	sess.callDone = make(chan struct{})
	done := sess.callDone
	return sess, cctx, func(err error) error {
		stop()
		cancel()
		close(done) // a push this call queued may start
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
	err = sess.publish(ctx, req.Step, req.Update, req.HasEval, req.Loss, req.Accuracy)
	if err != nil {
		return nil, end(toStatus(ctx, err))
	}
	return &pb.PublishReply{Step: req.Step}, end(nil)
}

// publish checks a step's update, counts the step, and queues the update
// for the exchange. What the trainer must wait for is the check and one
// copy of the vector out of the shared file; the conversion, signing and
// sending happen on the push loop.
func (sess *session) publish(ctx context.Context, step int64, t *pb.Tensor, hasEval bool, loss, acc float64) error {
	drv := sess.srv.drv
	if err := drv.CheckOrder(step); err != nil {
		return err
	}
	v, err := sess.vector(t, sess.upOff[step&1], "update")
	if err != nil {
		return badTensor(fmt.Errorf("step %d: %w", step, err))
	}
	bound := sess.srv.drv.Info().MaxAbsValue
	if bad := badValue(v, float32(min(bound, maxFloat32))); bad != "" {
		sess.srv.m.refusedUpdates.Inc()
		return fmt.Errorf("%w: the update of step %d: %s; nothing was published and the step was not counted", node.ErrBadUpdate, step, bad)
	}
	if hasEval && (math.IsNaN(loss) || math.IsInf(loss, 0) || !(acc >= 0 && acc <= 1 || math.IsNaN(acc))) {
		return failure(codes.InvalidArgument, pb.ErrorReason_ERROR_REASON_BAD_EVALUATION,
			fmt.Sprintf("step %d: evaluation loss %v, accuracy %v: want a finite loss and an accuracy in [0, 1] (NaN for none)", step, loss, acc),
			"step", strconv.FormatInt(step, 10))
	}
	slot := int(step % 2)
	select {
	case <-sess.free[slot]: // the push two steps back has finished with it
	case <-ctx.Done():
		return ctx.Err()
	}
	if err := drv.Done(step); err != nil { // Done checks the order again: it fails only if the node's step or barrier moved since CheckOrder
		sess.free[slot] <- struct{}{}
		return err
	}
	if hasEval {
		drv.Evaluated(step, loss, acc)
	}
	sess.raw[slot] = v
	if sess.srv.task.epidemic {
		// The model becomes the node's (one copy, which the pull's
		// average starts from) and goes to S peers; the region is free
		// again when the call returns.
		sess.shmMu.RLock()
		err := drv.Push32(step, sess.floats(slot), nil)
		sess.shmMu.RUnlock()
		sess.raw[slot] = nil
		sess.free[slot] <- struct{}{}
		return err
	}
	// The delta stays where it is, the request's own bytes or the step's
	// region of the shared file, until the push loop has read it: the
	// trainer writes that region again only after the next step's call,
	// which waits for the read (below).
	p := push{step: step, slot: slot, after: sess.callDone}
	if t.GetShared() != nil {
		p.read = make(chan struct{})
	}
	// The last step's update is read out of its region before this call
	// returns (at once, unless the trainer stepped within a millisecond
	// or two of its last call).
	sess.pushes <- p // room for two; the slot tokens bound what is queued
	prev := sess.readDone
	sess.readDone = p.read
	if prev != nil {
		select {
		case <-prev:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// Pull returns the peers' work to merge.
func (s *Server) Pull(ctx context.Context, req *pb.PullRequest) (*pb.PullReply, error) {
	sess, ctx, end, err := s.begin(ctx, sessionID(ctx), "pull")
	if err != nil {
		return nil, err
	}
	return sess.pull(), end(nil)
}

func (sess *session) pull() *pb.PullReply {
	task, drv := sess.srv.task, sess.srv.drv
	if r := drv.TakeReset(); r != nil {
		// The daemon took the job's step and model (another lineage, or
		// it was far ahead of every peer): the trainer takes them in
		// place of its own, and what arrived for its old model goes.
		task.dropPending()
		sess.srv.m.resets.Inc()
		sess.srv.log.Warn("the trainer takes the job's step and parameters", "step", r.Step, "lineage", r.Lineage, "why", r.Reason)
		return &pb.PullReply{Reset_: &pb.Reset{Step: r.Step, Lineage: r.Lineage, Reason: r.Reason,
			Params: dataTensor(appendFloat64As32(make([]byte, 0, 4*len(r.Params)), r.Params))}}
	}
	var buf []float32
	var idx, merged int
	if task.epidemic {
		buf, idx, merged = task.pullAverage(drv.Merge32)
	} else {
		var steps []int64
		buf, idx, merged, steps = task.pull()
		drv.NoteApplied(steps)
	}
	if merged == 0 {
		return &pb.PullReply{}
	}
	sess.srv.m.merged.Add(float64(merged))
	if sess.shm != nil && sess.shmOK.Load() {
		return &pb.PullReply{Merged: uint32(merged), Update: sharedTensor(sess.downOff[idx])}
	}
	return &pb.PullReply{Merged: uint32(merged), Update: dataTensor(appendFloat32(make([]byte, 0, 4*len(buf)), buf))}
}

// Step is Publish, Barrier for the next step, and Pull.
func (s *Server) Step(ctx context.Context, req *pb.StepRequest) (*pb.StepReply, error) {
	sess, ctx, end, err := s.begin(ctx, sessionID(ctx), "step")
	if err != nil {
		return nil, err
	}
	if err := sess.publish(ctx, req.Step, req.Update, req.HasEval, req.Loss, req.Accuracy); err != nil {
		return nil, end(toStatus(ctx, err))
	}
	b, err := sess.barrier(ctx, req.Step+1)
	if err != nil {
		return nil, end(toStatus(ctx, err))
	}
	return &pb.StepReply{Barrier: b, Pull: sess.pull()}, end(nil)
}

// Checkpoint writes the trainer's parameters to the daemon's checkpoint.
func (s *Server) Checkpoint(ctx context.Context, req *pb.CheckpointRequest) (*pb.CheckpointReply, error) {
	sess, ctx, end, err := s.begin(ctx, sessionID(ctx), "checkpoint")
	if err != nil {
		return nil, err
	}
	if req.Params.GetShared() != nil {
		return nil, end(badTensor(errors.New("checkpoint: the parameters go in data, not in the shared file")))
	}
	v, err := sess.vector(req.Params, 0, "parameters")
	if err != nil {
		return nil, end(badTensor(err))
	}
	if bad := badValue(v, maxFloat32); bad != "" {
		return nil, end(failuref(codes.InvalidArgument, pb.ErrorReason_ERROR_REASON_BAD_VALUE, "checkpoint: %s", bad))
	}
	p := make([]float64, sess.n)
	toFloat64(p, v)
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
