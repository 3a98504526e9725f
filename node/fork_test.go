package node

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/internal/builtin"
	"github.com/pspnode/pspnode/internal/memnet"
	"github.com/pspnode/pspnode/internal/syncbuf"
	"github.com/pspnode/pspnode/internal/vclock"
	"github.com/pspnode/pspnode/internal/wire"
	"github.com/pspnode/pspnode/model"
	"github.com/pspnode/pspnode/node/barrier"
	"github.com/pspnode/pspnode/node/status"
	"github.com/pspnode/pspnode/psp"
)

// Two forks of one job that meet converge on the older: here a job of
// three nodes has trained 400 steps when a node that started the job
// again on its own (a first node restarted without its peers: fresh
// model, step 0) meets it. The fork takes the job's step and model at
// once, and the job neither waits for it nor holds its reports against
// it. (Before, the job counted the fork's low step at its barrier and
// waited while the fork climbed from 0.)
func TestForksConverge(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		mn := memnet.New(0)
		t.Cleanup(func() { _ = mn.Close() })
		job := buildTestNodes(t, 3, "pssp:2:1", 0.01, memHosts(t, mn))
		fork := buildTestNodesWith(t, 1, "pssp:2:1", 0.01, memHosts(t, mn), func(c *nodeSetup) { c.WaitPeers = 0 })[0]
		ctx, cancel := context.WithCancel(t.Context())
		wait := runAll(t, ctx, job)
		defer func() { cancel(); wait() }()
		if !waitFor(60*time.Second, func() bool { return minStep(job) >= 400 }) {
			t.Fatalf("the job did not reach step 400: lowest at %d", minStep(job))
		}
		waitFork := runAll(t, ctx, []*Node{fork})
		defer func() { cancel(); waitFork() }()
		if !waitFor(10*time.Second, func() bool { return fork.Step() >= 3 }) {
			t.Fatalf("the fork did not train alone: step %d", fork.Step())
		}

		at := minStep(job)
		if err := fork.Host().Connect(ctx, peer.AddrInfo{ID: job[0].ID(), Addrs: job[0].Host().Addrs()}); err != nil {
			t.Fatal(err)
		}
		// Alone, the fork would need about 0.02 s a step: 8 s to climb to
		// the job's step.
		if !waitFor(time.Second, func() bool { return fork.Step() >= at }) {
			t.Fatalf("1 s after meeting the job at step %d the fork is at step %d", at, fork.Step())
		}
		var diff, norm float64
		want, got := job[0].model.Params(), fork.model.Params()
		for i := range want {
			diff += (got[i] - want[i]) * (got[i] - want[i])
			norm += want[i] * want[i]
		}
		if diff > 0.05*norm {
			t.Errorf("the fork's model is %.3g (squared) away from the job's (norm² %.3g): not the job's", diff, norm)
		}
		base := minStep(job)
		if !waitFor(4*time.Second, func() bool { return minStep(job) >= base+100 && fork.Step() >= base+100 }) {
			t.Errorf("4 s after the meeting the job moved from step %d to %d, the fork is at %d", base, minStep(job), fork.Step())
		}
		for _, nd := range append(job, fork) {
			for _, v := range []psp.Verdict{psp.Regressed, psp.Quarantined} {
				if n := status.CounterValue(nd.m.Screened.WithLabelValues(v.String())); n > 0 {
					t.Errorf("node %s screened %v reports as %s", nd.ID(), n, v)
				}
			}
		}
	})
}

// A node that runs another model than the job it joins is refused at its
// first step exchange: its Run ends with a *ModelMismatchError (pspnode run
// exits 2 on it), and the job's nodes say so once each and keep it out of
// their samples and population. (Before, it adopted the job's step and
// trained alone, counted by the others, and nobody said a word.)
func TestModelMismatchAtFirstContact(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		mn := memnet.New(0)
		t.Cleanup(func() { _ = mn.Close() })
		logs := make([]*syncbuf.Buffer, 2)
		job := buildTestNodesWith(t, 2, "pssp:1:1", 0.01, memHosts(t, mn), func(c *nodeSetup) {
			i := len(slices.DeleteFunc(slices.Clone(logs), func(b *syncbuf.Buffer) bool { return b == nil }))
			logs[i] = &syncbuf.Buffer{}
			c.opts = append(c.opts, WithLogger(slog.New(slog.NewTextHandler(logs[i], &slog.HandlerOptions{Level: slog.LevelWarn}))))
		})
		data, err := model.Open("synthetic")
		if err != nil {
			t.Fatal(err)
		}
		other, err := builtin.New(builtin.Spec{Model: "logreg", Shards: 1, SGD: model.DefaultSGDConfig()}, data)
		if err != nil {
			t.Fatal(err)
		}
		stranger := buildTestNodesWith(t, 1, "pssp:1:1", 0.01, memHosts(t, mn), func(c *nodeSetup) {
			c.opts = append(c.opts, WithTask(other))
			c.Bootstrap = []string{job[0].Addrs()[0].String()}
			c.WaitPeers = 0
		})[0]
		ctx, cancel := context.WithCancel(t.Context())
		wait := runAll(t, ctx, job)
		defer func() { cancel(); wait() }()
		if !waitFor(20*time.Second, func() bool { return minStep(job) >= 20 }) {
			t.Fatalf("the job did not train: lowest at %d", minStep(job))
		}

		done := make(chan error, 1)
		go func() { done <- stranger.Run(ctx) }()
		select {
		case err := <-done:
			var mm *ModelMismatchError
			if !errors.As(err, &mm) {
				t.Fatalf("the stranger's Run returned %v, want a *ModelMismatchError", err)
			}
			if mm.OwnModel != other.ModelID() || mm.PeerModel != job[0].model.ModelID() || mm.PeerParams != int64(job[0].model.NumParams()) {
				t.Errorf("the error does not name both models: %v", mm)
			}
		case <-time.After(10 * time.Second):
			cancel()
			<-done
			t.Fatalf("the stranger trained on for 10 s in a job of another model, at step %d", stranger.Step())
		}

		// The job goes on without it, and has it in neither its samples
		// nor its population (the stranger's node stays up, as a program
		// that ignores the error would leave it); each node that met it
		// said so once.
		base := minStep(job)
		if !waitFor(10*time.Second, func() bool { return minStep(job) >= base+50 }) {
			t.Errorf("the job stalled at step %d", minStep(job))
		}
		out := func() bool {
			for _, nd := range job {
				if slices.Contains(nd.Overlay().Peers(), stranger.ID()) {
					return false
				}
			}
			return true
		}
		if !waitFor(10*time.Second, out) {
			t.Errorf("the job's nodes still count the stranger among their peers")
		}
		said := 0
		for i, nd := range job {
			if got := nd.Overlay().PeerCount(); got != len(job)-1 {
				t.Errorf("node %d knows %d peers, want %d", i, got, len(job)-1)
			}
			n := strings.Count(logs[i].String(), "runs another model")
			if n > 1 {
				t.Errorf("node %d logged the other model %d times, want once:\n%s", i, n, logs[i])
			}
			said += n
		}
		if said == 0 {
			t.Error("no node of the job said that a peer runs another model")
		}
	})
}

// An answer from a peer of another model that comes after its check
// stopped waiting (drained) is said like any other: the node that asked
// may never hear from that peer again (a joiner that learns of the
// mismatch from the query exits), so keeping quiet there left the
// mismatch unsaid on the job's side.
func TestDrainedAnswerOfAnotherModelIsSaid(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		mn := memnet.New(0)
		t.Cleanup(func() { _ = mn.Close() })
		var log syncbuf.Buffer
		nodes := buildTestNodesWith(t, 2, "pssp:1:1", 0.01, memHosts(t, mn), func(c *nodeSetup) {
			c.opts = append(c.opts, WithLogger(slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelWarn}))))
		})
		n, stranger := nodes[0], nodes[1].ID()
		ext := n.kin.ownExt()
		ext.ModelID++
		results := make(chan barrier.PeerAnswer, 1)
		results <- barrier.PeerAnswer{Peer: stranger, A: barrier.Answer{Reply: wire.StepReply{Step: 3, Ext: &ext}}, Asked: 1}
		n.bar.Drain(results, 1)
		if !n.Overlay().HeldOut(stranger) {
			t.Error("a drained answer of another model: its peer is not held out")
		}
		if got := strings.Count(log.String(), "runs another model"); got != 1 {
			t.Errorf("a drained answer of another model was said %d times, want once:\n%s", got, log.String())
		}
	})
}
