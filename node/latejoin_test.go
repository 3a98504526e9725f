package node

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/pspnode/pspnode/internal/checkpoint"
)

// A node whose bootstrap peer comes up after it does not train alone
// meanwhile (its model would be its own, not the job's): it waits, then
// joins, adopts the job's step and fetches the job's model. Here the job
// is one node resumed from a checkpoint at step 40.
func TestLateBootstrapFetchesModel(t *testing.T) {
	bootKey, err := newIdentity()
	if err != nil {
		t.Fatal(err)
	}
	bootID, _ := peerIDOf(bootKey)
	port := freePort(t)
	built := buildTestNodesWith(t, 2, "asp", 0.01, nil, func(c *nodeSetup) {
		c.Overlay.JoinTimeout = 2 * time.Second
		c.Overlay.Join.RetryMin, c.Overlay.Join.RetryMax, c.Overlay.Join.Check = 50*time.Millisecond, 400*time.Millisecond, 100*time.Millisecond
		c.WaitPeers = 0
		c.StartTimeout = 200 * time.Millisecond // the old wait gave up after this
	})
	// built[0] only lends its trained model to a checkpoint; built[1]'s
	// task and configuration make the early node.
	path := filepath.Join(t.TempDir(), "job.ckpt")
	seedNode := built[0]
	seedNode.cfg.Checkpoint, seedNode.cfg.CheckpointEvery, seedNode.cfg.MaxSteps, seedNode.cfg.JoinFetch = path, 40, 40, false
	if err := seedNode.Run(t.Context()); err != nil {
		t.Fatal(err)
	}
	c, err := checkpoint.Read(path)
	if err != nil || c.Step != 40 {
		t.Fatalf("checkpoint %+v, %v", c, err)
	}
	_ = seedNode.Close()
	_ = built[1].Close()

	mk := func(edit func(*Config)) *Node {
		var nd *Node
		for _, n := range buildTestNodesWith(t, 1, "asp", 0.01, nil, func(c *nodeSetup) {
			c.Overlay.JoinTimeout = 2 * time.Second
			c.Overlay.Join.RetryMin, c.Overlay.Join.RetryMax, c.Overlay.Join.Check = 50*time.Millisecond, 400*time.Millisecond, 100*time.Millisecond
			c.WaitPeers, c.StartTimeout = 0, 200*time.Millisecond
			edit(&c.Config)
		}) {
			nd = n
		}
		return nd
	}
	early := mk(func(c *Config) {
		c.Bootstrap = []string{fmt.Sprintf("/ip4/127.0.0.1/tcp/%d/p2p/%s", port, bootID)}
	})
	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	done := make(chan error, 1)
	go func() { done <- early.Run(ctx) }()
	if !waitFor(20*time.Second, func() bool { return early.Status().JoinAttempts >= 5 }) {
		t.Fatalf("the early node did not retry: %+v", early.Status().JoinStatus)
	}
	if s := early.Step(); s != 0 {
		t.Fatalf("the early node trained alone to step %d before joining", s)
	}

	job := mk(func(c *Config) {
		c.Identity, c.Listen = bootKey, []string{fmt.Sprintf("/ip4/127.0.0.1/tcp/%d", port)}
		c.Checkpoint, c.CheckpointEvery, c.JoinFetch = path, 1000, false
	})
	job.resume()
	if job.Step() != 40 {
		t.Fatalf("the job node resumed at %d", job.Step())
	}
	if !waitFor(20*time.Second, func() bool { return early.Step() >= 40 }) {
		t.Fatalf("the early node is at step %d after its bootstrap came up (joined %v)", early.Step(), early.Status().Joined)
	}
	if !slices.Contains(early.Overlay().Peers(), job.ID()) {
		t.Error("the early node does not know the job node")
	}
	// The adopted model is the job's: the checkpoint's parameters, moved
	// by at most the few steps the early node has made since.
	got := early.model.Params()
	var diff, norm float64
	for i := range got {
		d := got[i] - c.Params[i]
		diff += d * d
		norm += c.Params[i] * c.Params[i]
	}
	if diff > 0.05*norm {
		t.Errorf("the early node's model is %.3g (squared) away from the job's (norm² %.3g): not fetched", diff, norm)
	}
	stop()
	if err := <-done; err != nil {
		t.Error(err)
	}
}
