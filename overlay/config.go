package overlay

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/pnet"
	ma "github.com/multiformats/go-multiaddr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pspnode/pspnode/internal/jobname"
)

// Config holds the settings of an Overlay. Start from DefaultConfig and set
// Job and the bootstrap peers; the other defaults suit networks from 2 to a
// few thousand nodes (see the package documentation for the reasoning).
type Config struct {
	// Job names the training job. The DHT speaks /psp/<job>/kad/1.0.0, so
	// nodes of different jobs never share a routing table. Required: 1 to
	// 64 letters, digits, '.', '_' or '-' (the rule node and gossip use).
	Job string

	// BootstrapPeers are peers to join through. Empty for the first node.
	BootstrapPeers []peer.AddrInfo
	// BootstrapAddrs are bootstrap peers as multiaddr strings ending in
	// /p2p/<id>; they are parsed by New and merged with BootstrapPeers.
	// An address without a peer ID (HOST:PORT, or a TCP multiaddr without
	// /p2p) names a peer by its address alone: its ID is learnt by a
	// pre-handshake at every join attempt (rendezvous.go), and an address
	// of this node's own is left out (the node then starts the job).
	BootstrapAddrs []string
	// PSK is the job's swarm key, which the pre-handshake to a bootstrap
	// address speaks through (nil: an open job). The host must be built
	// with the same key.
	PSK pnet.PSK
	// MDNS, if set, is the mDNS service name under which the overlay
	// announces itself and finds peers on the local network (mdns.go);
	// "" turns it off. MDNSWait is how long a node with no bootstrap
	// peers waits in New for a peer found that way before it starts
	// alone.
	MDNS     string
	MDNSWait time.Duration

	// BucketSize is Kademlia's k: routing-table bucket size and the number
	// of peers a lookup returns. The zone estimator treats buckets holding
	// fewer than k peers as complete.
	BucketSize int
	// Concurrency is Kademlia's α (parallel RPCs per lookup).
	Concurrency int
	// Resiliency is the number of closest peers that must answer before a
	// lookup ends.
	Resiliency int

	// RefreshInterval is how often the routing table is refreshed (a
	// self-lookup, one lookup per stale bucket, and a liveness ping of
	// peers not heard from). The library default of 10 minutes is tuned
	// for the public IPFS network; small networks refresh more often.
	RefreshInterval time.Duration
	// WalkInterval is the mean time between random-key lookups. Walks
	// discover peers for the sampler and feed the order-statistics
	// estimator.
	WalkInterval time.Duration
	// WarmupWalkInterval replaces WalkInterval during WarmupPeriod after
	// the join, so that a new node learns the population quickly.
	WarmupWalkInterval time.Duration
	// WarmupPeriod is how long the faster warm-up walks last.
	WarmupPeriod time.Duration
	// QueryTimeout bounds every DHT lookup and refresh.
	QueryTimeout time.Duration
	// JoinTimeout bounds connecting to the bootstrap peers in New.
	JoinTimeout time.Duration
	// KeepJoining makes New succeed when no bootstrap peer answers: the
	// overlay starts alone, as the first node of a job does, but keeps its
	// bootstrap peers and joins through the first that answers: it dials
	// them again whenever its routing table is empty, as a joined overlay
	// does, and so does its DHT; a connection its host makes to one of
	// them (a caller's own retry) fills the routing table too. JoinError
	// says why New could not join. Off, New fails with ErrJoin instead.
	KeepJoining bool
	// Join sets how an overlay with KeepJoining and bootstrap peers stays
	// joined through them: the retries, the routing-table check and the
	// split check (join.go). JoinHint, if set, adds a hint to the text of
	// a failed join (a node's: a swarm key missing or wrong).
	Join     JoinConfig
	JoinHint func(err string) string
	// PeersFile, if set, is a file where the overlay keeps the peers it
	// knows, and through which, restarted, it rejoins its job besides its
	// bootstrap peers (peersfile.go).
	PeersFile string

	// LivenessWindow is how long first-hand evidence of life (the peer
	// answered us, connected to us, or was reported with MarkAlive) keeps a
	// peer that we hold no connection to drawable by Sample. A peer that
	// departs is drawn at most this long after it was last heard from;
	// connected peers are drawable as long as the connection lasts.
	LivenessWindow time.Duration

	// PoolSize is the number of peers kept connected and verified: a
	// uniform random subset of all known live peers (reservoir sampling
	// over discoveries plus rotation), whose connections are protected at
	// both ends. They are always drawable, so Sample has at least PoolSize
	// peers to draw from whatever else the node hears, and their departures
	// are seen at once. Sample draws from every drawable peer, not only
	// from the pool.
	PoolSize int
	// RotateInterval is how often one pool member is swapped for a random
	// other known peer (a probe that also refreshes its evidence of life).
	RotateInterval time.Duration
	// MaintainInterval is the period of housekeeping: syncing the routing
	// table into the member set, watching the estimator's zone, expiring
	// state.
	MaintainInterval time.Duration
	// ProbeTimeout bounds one liveness probe (a dial).
	ProbeTimeout time.Duration
	// ProbeConcurrency is the number of concurrent liveness probes.
	ProbeConcurrency int
	// DegreeRefresh is how often a pool member is told again that our pool
	// holds it (a pool join, pool.go), which renews its hold on us and
	// returns its in-degree.
	DegreeRefresh time.Duration
	// MaxUnconfirmed bounds the peers known only from other nodes (named in
	// their lookup replies or routing tables) with no first-hand evidence
	// of life yet. Such sightings cost the naming peer nothing, so without
	// a bound a peer that names made-up IDs grows every node's member set
	// without end. Past the bound the peer sighted least recently is
	// forgotten; peers that answer, connect or are reported alive
	// (MarkAlive) do not count. Unconfirmed peers are never drawn by
	// Sample. 0 keeps none: peers are then learnt first-hand only (the
	// peers a lookup asks, those that connect).
	MaxUnconfirmed int
	// DeadHold is how long a peer found dead ignores third-party sightings
	// (other nodes' stale routing tables). First-hand evidence (it connects
	// to us, it answers a query, MarkAlive) revives it at once.
	DeadHold time.Duration

	// Seed seeds the overlay's own random choices: the pool's draws and
	// rotation, Sample, which dead peers are dialled again, the keys of
	// walks and refreshes, and the jitter of the background periods. 0
	// seeds them from crypto/rand. Each kind of choice has its own stream
	// derived from Seed, so an overlay with a given seed makes the same
	// choices of one kind whenever it has had the same inputs for that
	// kind: the same peers discovered in the same order, the same number
	// of walks before. The order of events in a live network depends on
	// timing as well, so a seeded network is not replayed exactly. Nodes of
	// one network need distinct seeds: overlays with the same seed walk the
	// same keys, and the estimator takes their walks as independent.
	Seed uint64
	// RetryDead is how often a peer held as dead is dialled again, until it
	// is forgotten (2 × DeadHold after it died); RevivalProbes bounds how
	// many such dials one maintenance round starts. This is what re-merges
	// the overlay after a partition heals: peers across the cut were all
	// found dead, and nothing else would make either side dial the other.
	RetryDead     time.Duration
	RevivalProbes int

	// EstimateWindow is how far back random-walk lookups count for the
	// order-statistics estimator; short enough to follow churn.
	EstimateWindow time.Duration
	// MaxLookups caps the lookups the order-statistics estimator counts:
	// the most recent ones win. During the warm-up's fast walks this
	// shortens the window, so that lookups made while the network was
	// still forming (a testnet builds 200 nodes in 4 s; they read N about
	// a third low) stop counting within seconds, not EstimateWindow.
	MaxLookups int
	// MinLookups is the number of full lookups in EstimateWindow the
	// order-statistics estimator needs before it gives an answer.
	MinLookups int
	// MinZonePeers is the number of peers the zone estimator needs in its
	// zone before it gives an answer.
	MinZonePeers int
	// ReportMaxAge is how long an estimate reported by a peer
	// (ObserveEstimate) counts.
	ReportMaxAge time.Duration
	// MaxReports caps the number of peer reports fused (the most recent
	// distinct peers win).
	MaxReports int

	// PerAddress bounds what peers behind one network address weigh
	// (diversity.go): Sample draws each of n > PerAddress live members
	// that connect from one address with weight PerAddress/n, at most
	// PerAddress of them into one sample, and the
	// routing table holds at most PerAddress of them per bucket and
	// 2·PerAddress in all. Many identities behind one address (Sybils)
	// then weigh what PerAddress peers do. Loopback addresses are exempt.
	// 0 turns the limits off.
	PerAddress int

	// Logger receives debug and warning logs. Nil discards them.
	Logger *slog.Logger
	// Registerer receives the join's metrics (psp_join_*, psp_joined).
	// Nil leaves them unregistered.
	Registerer prometheus.Registerer
}

// DefaultConfig returns settings for networks from 2 to a few thousand
// nodes. Set Job and the bootstrap peers before use.
func DefaultConfig() Config {
	return Config{
		Job:                "default",
		BucketSize:         20,
		Concurrency:        3,
		Resiliency:         3,
		RefreshInterval:    time.Minute,
		WalkInterval:       5 * time.Second,
		WarmupWalkInterval: 2 * time.Second,
		WarmupPeriod:       20 * time.Second,
		QueryTimeout:       10 * time.Second,
		JoinTimeout:        15 * time.Second,
		LivenessWindow:     20 * time.Second,
		PoolSize:           64,
		RotateInterval:     2 * time.Second,
		MaintainInterval:   5 * time.Second,
		ProbeTimeout:       3 * time.Second,
		ProbeConcurrency:   4,
		DegreeRefresh:      time.Minute,
		MaxUnconfirmed:     256,
		DeadHold:           2 * time.Minute,
		RetryDead:          15 * time.Second,
		RevivalProbes:      2,
		EstimateWindow:     45 * time.Second,
		MinLookups:         3,
		MaxLookups:         8,
		MinZonePeers:       4,
		ReportMaxAge:       30 * time.Second,
		MaxReports:         64,
		PerAddress:         1,
		Join:               DefaultJoinConfig(),
		MDNSWait:           2 * time.Second,
	}
}

// SharedMachineNodes is the number of nodes one machine carries with the
// default background periods; see ForSharedMachine. It was 200 while a
// lookup cost about 25 requests and every DHT request left a stream open;
// with our own lookups (walk.go) 200 nodes at rest use 0.15 cores.
const SharedMachineNodes = 500

// ForSharedMachine returns c adjusted for nodes overlays that share one
// machine (a local testnet, the benchmark harness). Every overlay walks,
// rotates its pool (a dial each time) and refreshes on its own clock: cheap
// for one node on its own machine, but in one process their sum grows with
// nodes. Above SharedMachineNodes the walk, rotation, refresh and in-degree
// refresh periods are stretched by nodes/SharedMachineNodes, so the
// machine's total background load stays that of SharedMachineNodes nodes.
// At or below it, c is returned as is.
//
// The estimate window is not stretched with the walks: it sets how quickly
// the order-statistics estimate follows a change of N (a window still half
// full of walks from the join, or from before a wave of departures, is off
// by half the change), so it grows only as far as it must to hold
// MinLookups+1 walks. Fewer walks per node widen each node's own estimate;
// the peers' reports (Estimate) pool many nodes' walks and narrow it again.
func (c Config) ForSharedMachine(nodes int) Config {
	f := float64(nodes) / SharedMachineNodes
	if f <= 1 {
		return c
	}
	stretch := func(d time.Duration) time.Duration { return time.Duration(float64(d) * f) }
	c.WalkInterval = stretch(c.WalkInterval)
	c.RotateInterval = stretch(c.RotateInterval)
	c.RefreshInterval = stretch(c.RefreshInterval)
	c.DegreeRefresh = stretch(c.DegreeRefresh)
	c.EstimateWindow = max(c.EstimateWindow, time.Duration(c.MinLookups+1)*c.WalkInterval)
	return c
}

// ErrInvalidConfig reports an unusable Config.
var ErrInvalidConfig = errors.New("overlay: invalid config")

// Validate reports the first unusable field of c, wrapping
// ErrInvalidConfig. New calls it; node, overlay and gossip each have one.
func (c Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	if err := jobname.Validate(c.Job); err != nil {
		return bad("%v", err)
	}
	switch {
	case c.BucketSize < 2:
		return bad("BucketSize %d < 2", c.BucketSize)
	case c.Concurrency < 1 || c.Resiliency < 1:
		return bad("Concurrency and Resiliency must be ≥ 1")
	case c.PoolSize < 1:
		return bad("PoolSize %d < 1", c.PoolSize)
	case c.ProbeConcurrency < 1:
		return bad("ProbeConcurrency %d < 1", c.ProbeConcurrency)
	case c.MinLookups < 1 || c.MinZonePeers < 1 || c.MaxReports < 1:
		return bad("MinLookups, MinZonePeers and MaxReports must be ≥ 1")
	case c.MaxLookups < c.MinLookups:
		return bad("MaxLookups %d < MinLookups %d", c.MaxLookups, c.MinLookups)
	}
	for name, d := range map[string]time.Duration{
		"RefreshInterval": c.RefreshInterval, "WalkInterval": c.WalkInterval,
		"WarmupWalkInterval": c.WarmupWalkInterval, "QueryTimeout": c.QueryTimeout,
		"JoinTimeout": c.JoinTimeout, "RotateInterval": c.RotateInterval,
		"MaintainInterval": c.MaintainInterval, "ProbeTimeout": c.ProbeTimeout,
		"DegreeRefresh": c.DegreeRefresh, "LivenessWindow": c.LivenessWindow,
		"EstimateWindow": c.EstimateWindow, "ReportMaxAge": c.ReportMaxAge,
	} {
		if d <= 0 {
			return bad("%s must be positive", name)
		}
	}
	if c.KeepJoining {
		if err := c.Join.validate(); err != nil {
			return bad("%v", err)
		}
	}
	if len(c.PSK) != 0 && len(c.PSK) != 32 {
		return bad("PSK of %d bytes: want 32", len(c.PSK))
	}
	if c.MDNSWait < 0 {
		return bad("MDNSWait %v must not be negative", c.MDNSWait)
	}
	if c.WarmupPeriod < 0 || c.DeadHold < 0 || c.RetryDead < 0 || c.RevivalProbes < 0 || c.PerAddress < 0 || c.MaxUnconfirmed < 0 {
		return bad("WarmupPeriod, DeadHold, RetryDead, RevivalProbes, PerAddress and MaxUnconfirmed must not be negative")
	}
	return nil
}

// Bootstrap is the overlay's bootstrap peers: BootstrapPeers and the
// parsed BootstrapAddrs, one AddrInfo per peer (the addresses of one peer
// merged).
func (c Config) Bootstrap() ([]peer.AddrInfo, error) {
	if _, err := c.rendezvous(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	var out []peer.AddrInfo
	for _, ai := range c.BootstrapPeers {
		out = addInfo(out, peer.AddrInfo{ID: ai.ID, Addrs: slices.Clone(ai.Addrs)})
	}
	parsed, err := ParseBootstrap(c.BootstrapAddrs)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	for _, ai := range parsed {
		out = addInfo(out, ai)
	}
	return out, nil
}

func (c *Config) logger() *slog.Logger {
	if c.Logger != nil {
		return c.Logger
	}
	return slog.New(slog.DiscardHandler)
}

// rendezvous is the bootstrap addresses given without a peer ID, parsed.
func (c Config) rendezvous() ([]ma.Multiaddr, error) {
	var out []ma.Multiaddr
	for _, s := range c.BootstrapAddrs {
		if !IsRendezvous(s) {
			continue
		}
		a, err := ParseRendezvous(s)
		if err != nil {
			return nil, err
		}
		if !slices.ContainsFunc(out, a.Equal) {
			out = append(out, a)
		}
	}
	return out, nil
}
