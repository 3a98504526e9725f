package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/peterbourgon/ff/v3"
	"github.com/peterbourgon/ff/v3/ffcli"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pspnode/pspnode/internal/builtin"
	"github.com/pspnode/pspnode/model"
	"github.com/pspnode/pspnode/node"
	"github.com/pspnode/pspnode/node/exchange"
	"github.com/pspnode/pspnode/node/netsetup"
	nodestatus "github.com/pspnode/pspnode/node/status"
	"github.com/pspnode/pspnode/node/trainer"
	"github.com/pspnode/pspnode/overlay"
	"github.com/pspnode/pspnode/psp"
)

// stringList is a repeatable, comma-separated string flag. An empty
// value or element is an error: an empty --bootstrap (an unset shell
// variable, say) must not quietly make a node the first of a new job.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error {
	for _, f := range strings.Split(v, ",") {
		if f = strings.TrimSpace(f); f == "" {
			return fmt.Errorf("empty address in %q (leave the flag out instead)", v)
		}
		*l = append(*l, f)
	}
	return nil
}

// specFlag is one barrier spec.
type specFlag struct{ psp.Spec }

func (s *specFlag) Set(v string) error {
	sp, err := psp.Parse(v)
	if err != nil {
		return err
	}
	s.Spec = sp
	return nil
}

func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, usagef("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, usagef("--log-format %q: want text or json", format)
}

// runFlags are the run command's flags.
type runFlags struct {
	listen, bootstrap                                 stringList
	barrier                                           specFlag
	pollShare                                         floatFlag
	pace                                              paceFlag
	exchange                                          exchange.Spec
	staleSteps                                        *float64
	trainer                                           trainerFlags
	identity, job, modelName, data, httpAddr          *string
	ckpt, logLevel, logFormat, swarmKey, allow, reach *string
	shards, shard, waitPeers, perAddr, batch          *int
	evalEvery, ckptEvery                              *int
	maxSteps                                          *int64
	duration, pollMax, queryTime                      *time.Duration
	scale, factor, lr                                 *float64
	traversal, relaySvc, startSig, pprof, mdns        *bool
}

// addRunFlags defines the run command's flags on fs.
func addRunFlags(fs *flag.FlagSet) *runFlags {
	def := node.DefaultConfig()
	f := &runFlags{barrier: specFlag{def.Barrier}, pollShare: shareFlag(def.Check.PollShare), pace: paceFlag{def.Check.Pace}, exchange: def.Exchange.Spec}
	f.identity = fs.String("identity", "", "private key file; created with mode 0600 on first run and reused after (empty: a fresh identity every run); the peers the node knows are kept beside it in FILE.peers, and a restart rejoins the job through them")
	f.job = fs.String("job", def.Job, "job name: namespaces protocols (/psp/<job>/...) and the update topic")
	f.modelName = fs.String("model", "linreg", "model: none, linreg, logreg, mlp or mlp:H")
	f.data = fs.String("data", "synthetic", "data: synthetic, mnist (the MNIST test set built in: 8000 training, 2000 held-out images), or mnist:DIR (your own IDX files, gzip or raw)")
	f.shards = fs.Int("shards", 16, "the training data is dealt into this many shards; the node takes the one its peer ID hashes to")
	f.shard = fs.Int("shard", -1, "take this shard index instead of hashing the peer ID (0 <= shard < shards)")
	f.httpAddr = fs.String("http", "", "serve /metrics and /status on this address, e.g. 127.0.0.1:9090 (port 0: any free port)")
	f.pprof = fs.Bool("pprof", false, "with --http, also serve Go's profiles under /debug/pprof/ (go tool pprof http://ADDR/debug/pprof/heap): for finding where a daemon's memory or CPU goes; anyone who can reach the address can read them")
	f.maxSteps = fs.Int64("max-steps", 0, "stop after this many steps (0: no limit)")
	f.duration = fs.Duration("duration", 0, "stop after this long (0: until SIGINT/SIGTERM)")
	f.scale = fs.Float64("time-scale", 0, "add the paper's synthetic task time, (Exp(1)+1) s × this, to every step (0: off)")
	f.factor = fs.Float64("straggle-factor", 1, "multiply the synthetic task time (make this node a straggler)")
	f.pollMax = fs.Duration("poll-max", def.Check.PollMax, "waiting at a barrier, re-check at least this often whatever the step time (> 0)")
	f.queryTime = fs.Duration("query-timeout", def.Check.QueryTimeout, "the longest a step query may take before its peer counts as dead (> 0); fast steps shorten it (4 × compute time, 16 round trips, at least 50 ms)")
	f.waitPeers = fs.Int("wait-peers", 0, "before the first step, wait (up to 30 s) until this many peers are known")
	f.perAddr = fs.Int("per-address", def.Overlay.PerAddress, "peers connecting from one address (IPv4 address, IPv6 /64; loopback exempt) weigh together as this many in barrier samples and the routing table, against many identities on one host (0: off)")
	f.lr = fs.Float64("lr", model.DefaultSGDConfig().LR0, "initial learning rate")
	f.batch = fs.Int("batch", model.DefaultSGDConfig().BatchSize, "mini-batch size")
	f.evalEvery = fs.Int("eval-every", def.EvalEvery, "evaluate on the held-out data every this many steps (0: never)")
	f.ckpt = fs.String("checkpoint", "", "write step and model to this file (atomically) and resume from it on start; a corrupt file is reported and the model fetched from peers")
	f.ckptEvery = fs.Int("checkpoint-every", def.CheckpointEvery, "steps between checkpoints")
	f.logLevel = fs.String("log-level", "info", "debug, info, warn or error")
	f.logFormat = fs.String("log-format", "text", "text or json (logs go to stderr)")
	_ = fs.String("config", "", "read flags from this file (one 'flag value' per line)")
	f.swarmKey = fs.String("swarm-key", "", "make the job private: a swarm.key file (kubo's format; 'pspnode keygen --swarm-key FILE' writes one) every node of the job holds; only TCP runs")
	f.allow = fs.String("allow-peers", "", "refuse every peer whose ID is not in this file (one peer ID per line, # comments)")
	f.traversal = fs.Bool("nat-traversal", def.NAT.Traversal, "find out whether peers can dial this node (AutoNAT); behind a NAT, announce addresses through relays at the bootstrap peers and punch holes for direct connections (DCUtR)")
	f.relaySvc = fs.Bool("relay-service", def.NAT.RelayService, "when AutoNAT finds this node publicly reachable, relay for peers behind NATs (go-libp2p's limits: 128 reservations, each relayed connection 2 min and 128 KiB); needs --nat-traversal")
	f.reach = fs.String("reachability", "auto", "auto (AutoNAT finds out), public (known reachable, e.g. a job's only public bootstrap node: relay at once) or private (known to be behind a NAT: use relays at once); needs --nat-traversal")
	f.startSig = fs.Bool("start-on-signal", false, "join and serve, but take the first step only after SIGUSR1 arrives (for a harness that starts many nodes and then starts them training at once; Unix)")
	fs.Var(&f.listen, "listen", "multiaddrs to listen on, repeatable or comma-separated (default TCP and QUIC on all interfaces, port 4001)")
	fs.Var(&f.bootstrap, "bootstrap", "peers to join through: HOST:PORT (a node's TCP address; its peer ID is learnt by a handshake, through the swarm key if set: every worker may be given the same one, the node at it included, as DDP's MASTER_ADDR:MASTER_PORT) or multiaddrs ending in /p2p/<id> (/ip4, /ip6, /dns4, /dns6); repeatable or comma-separated; unreachable ones are retried with backoff (none for the first node)")
	f.mdns = fs.Bool("mdns", false, "find the job's other nodes on the local network with no address (mDNS); off by default: it announces on the network that a node of the job runs here, and where")
	fs.Var(&f.barrier, "barrier", barrierHelp("barrier spec"))
	fs.Var(&f.pollShare, "poll-share", pollShareHelp)
	fs.Var(&f.pace, "pace", paceHelp)
	fs.Var(&f.exchange, "exchange", exchangeHelp)
	f.staleSteps = fs.Float64("stale-steps", def.Exchange.StaleSteps, staleStepsHelp)
	f.trainer = addTrainerFlags(fs)
	return f
}

func runCommand(stdout, stderr io.Writer) *ffcli.Command {
	fs := newFlagSet("pspnode run", stderr)
	f := addRunFlags(fs)
	return &ffcli.Command{
		Name:       "run",
		ShortUsage: "pspnode run [--bootstrap HOST:PORT] [--barrier pssp:auto:4] [--model linreg] [--http 127.0.0.1:9090] [flags]",
		ShortHelp:  "run a node: join the job, train, obey the barrier",
		LongHelp: `Starts a node. It prints its peer ID and dialable multiaddrs on stdout, so a
second node can join with --bootstrap <one of them>. It trains its shard of
the data, publishes each update on the job's GossipSub topic, and before every
step asks a fresh random sample of β peers for their steps. SIGINT or SIGTERM
stops it cleanly (peers are told it leaves) with exit code 0.

Every flag can also come from the environment (PSPNODE_BARRIER=pbsp:8) or
from --config FILE, one 'flag value' per line.

Example, two nodes on one machine, both given the first one's address (as
DDP's ranks are given MASTER_ADDR:MASTER_PORT; the first finds it is its own
and starts the job):
  pspnode run --listen /ip4/127.0.0.1/tcp/4001 --bootstrap 127.0.0.1:4001 --http 127.0.0.1:9090
  pspnode run --listen /ip4/127.0.0.1/tcp/4002 --bootstrap 127.0.0.1:4001` + barrierSpecsHelp,
		FlagSet: fs,
		Options: append(envOptions(), ff.WithConfigFileFlag("config"), ff.WithConfigFileParser(ff.PlainParser)),
		Exec: func(ctx context.Context, args []string) error {
			if len(args) > 0 {
				return usagef("run takes no arguments, got %q", args)
			}
			return f.run(ctx, fs, stdout, stderr)
		},
	}
}

// run is the run command once its flags are parsed: check them, build the
// node, and run it until a stop criterion or a signal.
func (f *runFlags) run(ctx context.Context, fs *flag.FlagSet, stdout, stderr io.Writer) error {
	if err := f.trainer.check(fs); err != nil {
		return err
	}
	var waitStart func(context.Context) error
	if *f.startSig {
		wait, stop, err := notifyStart()
		if err != nil {
			return err
		}
		defer stop()
		waitStart = wait
	}
	log, err := newLogger(stderr, *f.logLevel, *f.logFormat)
	if err != nil {
		return err
	}
	if *f.trainer.owned {
		var cancel context.CancelFunc
		ctx, cancel = ownedBy(ctx, os.Stdin, log)
		defer cancel()
	}
	cfg, err := f.config(fs, log)
	if err != nil {
		return err
	}
	pre, err := runPreflight(*f.modelName, *f.data, *f.ckpt, cfg.Listen, len(f.listen) > 0, *f.httpAddr)
	if err != nil {
		return err
	}
	defer pre.Close()
	nd, tsrv, err := f.newNode(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer nd.Close()
	if tsrv != nil {
		defer tsrv.Close()
	}
	if err := checkListening(nd.Host(), pre.listen); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "peer id: %s\n", nd.ID())
	for _, a := range nd.Addrs() {
		fmt.Fprintf(stdout, "listening: %s\n", a)
	}
	if tsrv != nil {
		fmt.Fprintf(stdout, "trainer: %s\n", tsrv.Addr())
	}
	if pre.http != nil {
		srv := pre.serve(nd, *f.pprof)
		defer srv.Close()
		fmt.Fprintf(stdout, "http: http://%s (/status, /metrics)\n", srv.Addr())
	}
	modelName := *f.modelName
	if tsrv != nil {
		modelName = "the trainer's"
	}
	log.Info("node started", "job", cfg.Job, "barrier", cfg.Barrier.String(), "model", modelName, "bootstrap", len(f.bootstrap))
	logNAT(log, cfg)
	if waitStart != nil {
		log.Info("waiting for SIGUSR1 to start training")
		if err := waitStart(ctx); err != nil {
			return nd.Leave(leaveNotice) // interrupted before training: a clean stop
		}
	}
	return f.train(ctx, nd, tsrv, cfg, log)
}

// config is the node's Config from the flags; a bad flag is a usage error.
func (f *runFlags) config(fs *flag.FlagSet, log *slog.Logger) (node.Config, error) {
	cfg := node.DefaultConfig()
	cfg.Job, cfg.Barrier = *f.job, f.barrier.Spec
	cfg.UserAgent = "pspnode/" + buildVersion()
	if len(f.listen) > 0 {
		cfg.Listen = f.listen
	}
	cfg.Bootstrap, cfg.MDNS = f.bootstrap, *f.mdns
	if err := privateJob(&cfg, *f.swarmKey, *f.allow, len(f.listen) > 0, log); err != nil {
		return cfg, err
	}
	if err := natTraversal(&cfg, fs, *f.traversal, *f.relaySvc, *f.reach); err != nil {
		return cfg, err
	}
	cfg.MaxSteps, cfg.Duration, cfg.WaitPeers, cfg.EvalEvery = *f.maxSteps, *f.duration, *f.waitPeers, *f.evalEvery
	cfg.Checkpoint, cfg.CheckpointEvery, cfg.Check.PollShare = *f.ckpt, *f.ckptEvery, f.pollShare.x
	if *f.pollMax <= 0 {
		return cfg, usagef("--poll-max must be a positive duration (got %v)", *f.pollMax)
	}
	if *f.queryTime <= 0 {
		return cfg, usagef("--query-timeout must be a positive duration (got %v)", *f.queryTime)
	}
	if *f.perAddr < 0 {
		return cfg, usagef("--per-address must be >= 0 (got %d)", *f.perAddr)
	}
	cfg.Overlay.PerAddress = *f.perAddr
	cfg.Check.PollMax, cfg.Check.QueryTimeout, cfg.Check.Pace = *f.pollMax, *f.queryTime, f.pace.c
	cfg.Exchange.Spec = f.exchange
	if !(*f.staleSteps >= 0) {
		return cfg, usagef("--stale-steps %v: want a number of steps >= 0 (0: every model or update counts fully)", *f.staleSteps)
	}
	cfg.Exchange.StaleSteps = *f.staleSteps
	if *f.scale < 0 || *f.factor <= 0 {
		return cfg, usagef("--time-scale must be >= 0 and --straggle-factor > 0")
	}
	if *f.shards < 1 || *f.shard >= *f.shards {
		return cfg, usagef("--shard %d of --shards %d: need 0 <= shard < shards", *f.shard, *f.shards)
	}
	if *f.identity != "" {
		key, err := loadIdentity(*f.identity)
		if err != nil {
			return cfg, err
		}
		if _, err := lockIdentity(*f.identity); err != nil { // held until the process ends
			return cfg, usageError{err}
		}
		cfg.Identity = key
		cfg.Overlay.PeersFile = *f.identity + ".peers"
	} else {
		log.Info("using a fresh identity; pass --identity FILE to keep one across runs")
	}
	if err := cfg.Validate(); err != nil {
		return cfg, usageError{err}
	}
	return cfg, nil
}

// newNode builds the node: driven by a trainer with --trainer (which
// serves it), or training its built-in task.
func (f *runFlags) newNode(ctx context.Context, cfg node.Config, log *slog.Logger) (*node.Node, *trainer.Server, error) {
	reg := prometheus.NewRegistry()
	nodestatus.RegisterProcessMetrics(reg)
	spec := builtin.Spec{
		Model: *f.modelName, Shards: *f.shards,
		SGD:  model.SGDConfig{BatchSize: *f.batch, LR0: *f.lr, Decay: model.DefaultSGDConfig().Decay},
		Time: builtin.TimeModel{Scale: *f.scale, Factor: *f.factor},
	}
	if f.trainer.enabled() {
		return newDrivenNode(ctx, cfg, f.trainer, log, reg)
	}
	dataset, err := openData(spec.Model, *f.data)
	if err != nil {
		return nil, nil, err
	}
	nd, err := newNodeWithTask(ctx, cfg, spec, dataset, *f.shard, node.WithLogger(log), node.WithRegistry(reg))
	return nd, nil, err
}

// train runs the node until a stop criterion or a signal: its own step
// loop, or, with a trainer, the trainer's session.
func (f *runFlags) train(ctx context.Context, nd *node.Node, tsrv *trainer.Server, cfg node.Config, log *slog.Logger) error {
	start := time.Now()
	if tsrv != nil {
		if cfg.Duration > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, cfg.Duration)
			defer cancel()
		}
		serveTrainer(ctx, tsrv, log)
		_ = tsrv.Close()
		log.Info("node stopping", "step", nd.Status().Step, "uptime", time.Since(start).Round(time.Millisecond), "reason", stopReason(ctx, nil))
		return nd.Leave(leaveNotice)
	}
	err := nd.Run(ctx)
	st := nd.Status()
	log.Info("node stopping", "step", st.Step, "uptime", time.Since(start).Round(time.Millisecond), "reason", stopReason(ctx, err))
	if mm := (*node.ModelMismatchError)(nil); errors.As(err, &mm) {
		// The job is not this node's to join with this model: a
		// usage error, as a bad flag is.
		return usagef("--model %s (--data %s): the job's peers run another model: %v; start every node of a job with the same --model and --data, or this one with another --job",
			*f.modelName, *f.data, mm)
	}
	if err != nil {
		return err
	}
	return nd.Leave(leaveNotice)
}

// natTraversal sets cfg.NAT from --nat-traversal, --relay-service and
// --reachability. A relay service asked for without NAT traversal is a
// usage error (only AutoNAT, or --reachability public, starts it), and so
// is a fixed reachability.
func natTraversal(cfg *node.Config, fs *flag.FlagSet, traversal, relay bool, reach string) error {
	relaySet := false
	fs.Visit(func(f *flag.Flag) { relaySet = relaySet || f.Name == "relay-service" })
	if !traversal && relay && relaySet {
		return usagef("--relay-service needs --nat-traversal: the service starts when AutoNAT finds the node public")
	}
	cfg.NAT = netsetup.NATConfig{Traversal: traversal, RelayService: traversal && relay}
	switch reach {
	case "auto":
	case "public":
		cfg.NAT.Reachability = network.ReachabilityPublic
	case "private":
		cfg.NAT.Reachability = network.ReachabilityPrivate
	default:
		return usagef("--reachability %q: want auto, public or private", reach)
	}
	if reach != "auto" && !traversal {
		return usagef("--reachability %s needs --nat-traversal", reach)
	}
	return nil
}

// logNAT says at start what the node does about NATs.
// leaveNotice is how long a stopping node gives its peers' leave notices.
const leaveNotice = 300 * time.Millisecond

func logNAT(log *slog.Logger, cfg node.Config) {
	if !cfg.NAT.Traversal {
		log.Info("NAT traversal off (--nat-traversal=false): no AutoNAT, relays or hole punching; peers must reach this node at its listen addresses")
		return
	}
	transports := "TCP and QUIC"
	if len(cfg.PSK) > 0 {
		transports = "TCP (private job: relayed connections carry the swarm key too)"
	}
	relays, _ := overlay.ParseBootstrap(cfg.Bootstrap) // validated already
	reach := "auto (AutoNAT)"
	switch cfg.NAT.Reachability {
	case network.ReachabilityPublic:
		reach = "public (fixed)"
	case network.ReachabilityPrivate:
		reach = "private (fixed)"
	}
	log.Info("NAT traversal: AutoNAT, hole punching, relays at the bootstrap peers",
		"relays", len(relays), "relay_service", cfg.NAT.RelayService, "reachability", reach, "over", transports)
	if len(cfg.Bootstrap) == 0 {
		log.Info("no bootstrap peers: behind a NAT this node has no relay, and only peers it dials can reach it")
	}
}

func stopReason(ctx context.Context, err error) string {
	switch {
	case err != nil:
		return err.Error()
	case errors.Is(ctx.Err(), context.Canceled):
		return "signal"
	}
	return "stop criterion"
}

// newNodeWithTask builds the node, with opts, then its task, whose shard
// depends on the node's peer ID unless shard >= 0.
func newNodeWithTask(ctx context.Context, cfg node.Config, spec builtin.Spec, data model.Data, shard int, opts ...node.Option) (*node.Node, error) {
	if cfg.Identity == nil {
		key, err := newIdentity()
		if err != nil {
			return nil, err
		}
		cfg.Identity = key
	}
	id, err := peerIDOf(cfg.Identity)
	if err != nil {
		return nil, err
	}
	spec.Shard = shard
	if shard < 0 {
		spec.Shard = model.ShardIndex(id.String(), spec.Shards)
	}
	spec.Seed = builtin.SeedOf(id.String())
	spec.InitSeed = builtin.SeedOf(cfg.Job)
	task, err := builtin.New(spec, data)
	if err != nil {
		// The specs passed checkModel and checkData: what is left is
		// their combination (linreg on MNIST) or a model too large.
		return nil, usagef("--model %s does not fit --data: %v", spec.Model, err)
	}
	return node.New(ctx, cfg, append(opts, node.WithTask(task))...)
}

func idCommand(stdout, stderr io.Writer) *ffcli.Command {
	fs := newFlagSet("pspnode id", stderr)
	identity := fs.String("identity", "", "private key file (created with mode 0600 if missing)")
	return &ffcli.Command{
		Name:       "id",
		ShortUsage: "pspnode id --identity FILE",
		ShortHelp:  "print the peer ID of an identity file (creating the key if missing) without starting",
		FlagSet:    fs,
		Options:    envOptions(),
		Exec: func(context.Context, []string) error {
			if *identity == "" {
				return usagef("--identity FILE is required")
			}
			key, err := loadIdentity(*identity)
			if err != nil {
				return err
			}
			id, err := peerIDOf(key)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintln(stdout, id)
			return err
		},
	}
}
