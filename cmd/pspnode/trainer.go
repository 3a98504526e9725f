package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pspnode/pspnode/node"
	"github.com/pspnode/pspnode/node/trainer"
)

// trainerFlags are pspnode run's flags for a trainer in another process
// (the trainer API, package node/trainer).
type trainerFlags struct {
	listen *string
	maxMsg *int
	shm    *bool
	owned  *bool
}

func addTrainerFlags(fs *flag.FlagSet) trainerFlags {
	def := trainer.DefaultConfig()
	return trainerFlags{
		listen: fs.String("trainer", "", "serve the trainer API here: unix:PATH or tcp:127.0.0.1:PORT. The node then trains nothing itself: a trainer process (e.g. the Python client's pspnode.Optimizer around a PyTorch loop) connects, brings its model, and drives the node's steps; the node keeps membership, the barrier and the exchange. Without a trainer connected, the node stays out of its peers' barriers"),
		maxMsg: fs.Int("trainer-max-message", def.MaxMessageBytes, "with --trainer: the largest message on the trainer's socket, in bytes (4 per parameter when tensors do not go through shared memory)"),
		shm:    fs.Bool("trainer-shm", def.SharedMemory, "with --trainer: offer a trainer on this machine a shared file in /dev/shm for its tensors, so that no copy of the model crosses the socket (Linux)"),
		owned:  fs.Bool("trainer-owned", false, "with --trainer: the process that started this daemon owns it: stop cleanly, as on SIGTERM, when standard input reaches its end, which it does when that process exits however it exits (the Python client's pspnode.Optimizer starts its daemon so, with a pipe on its standard input)"),
	}
}

// enabled reports whether --trainer was given.
func (t trainerFlags) enabled() bool { return *t.listen != "" }

// check refuses the flags that make no sense with a trainer: the built-in
// model, its data and its training.
func (t trainerFlags) check(fs *flag.FlagSet) error {
	if !t.enabled() {
		var stray []string
		fs.Visit(func(f *flag.Flag) {
			if f.Name == "trainer-max-message" || f.Name == "trainer-shm" || f.Name == "trainer-owned" {
				stray = append(stray, "--"+f.Name)
			}
		})
		if len(stray) > 0 {
			return usagef("%s needs --trainer", strings.Join(stray, ", "))
		}
		return nil
	}
	var bad []string
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "model", "data", "shards", "shard", "lr", "batch", "eval-every", "time-scale", "straggle-factor", "max-steps", "checkpoint-every", "start-on-signal":
			bad = append(bad, "--"+f.Name)
		}
	})
	if len(bad) > 0 {
		return usagef("--trainer: the trainer brings the model, its data and its training; %s belong(s) to the built-in models", strings.Join(bad, ", "))
	}
	if *t.maxMsg < 1<<20 {
		return usagef("--trainer-max-message %d: at least 1048576 bytes", *t.maxMsg)
	}
	if err := trainer.CheckListen(*t.listen); err != nil {
		return usagef("--trainer %s: %v", *t.listen, strings.TrimPrefix(err.Error(), "trainer: "))
	}
	return nil
}

// ownedBy returns ctx, ended also when in reaches its end or fails
// (--trainer-owned: the owner's pipe closed). The reader stops with the
// process.
func ownedBy(ctx context.Context, in io.Reader, log *slog.Logger) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		_, err := io.Copy(io.Discard, in)
		if ctx.Err() == nil {
			log.Info("standard input closed: the owning process is gone; stopping (--trainer-owned)", "err", err)
		}
		cancel()
	}()
	return ctx, cancel
}

// newDrivenNode builds a node whose steps a trainer drives, and its
// trainer API server.
func newDrivenNode(ctx context.Context, cfg node.Config, t trainerFlags, log *slog.Logger, reg *prometheus.Registry) (*node.Node, *trainer.Server, error) {
	task := trainer.NewRemoteModel()
	cfg.Driven = true
	nd, err := node.New(ctx, cfg, node.WithModel(task), node.WithLogger(log), node.WithRegistry(reg))
	if err != nil {
		return nil, nil, err
	}
	tcfg := trainer.DefaultConfig()
	tcfg.Listen, tcfg.MaxMessageBytes, tcfg.SharedMemory = *t.listen, *t.maxMsg, *t.shm
	tcfg.Logger, tcfg.Registerer = log, reg
	srv, err := trainer.New(nd, task, tcfg)
	if err != nil {
		_ = nd.Close()
		return nil, nil, usageError{fmt.Errorf("--trainer: %w", err)}
	}
	return nd, srv, nil
}

// serveTrainer keeps a driven node up until ctx ends (a signal, or
// --duration).
func serveTrainer(ctx context.Context, srv *trainer.Server, log *slog.Logger) {
	log.Info("waiting for a trainer", "address", srv.Addr())
	<-ctx.Done()
}
