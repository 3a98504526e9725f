// Package overlay is pspnode's structured overlay: membership through a
// Kademlia DHT (go-libp2p-kad-dht), bootstrap, the population estimate from
// the density of a node's zone of the ID space, uniform sampling of β live
// peers, and liveness.
//
// # Join
//
// New builds a DHT over the caller's libp2p host in server mode with the
// protocol prefix /psp/<job> (so the DHT speaks /psp/<job>/kad/1.0.0 and
// never mixes with IPFS or with another job), with no public bootstrap
// peers, and with the provider and value record stores disabled: the DHT is
// used only for membership. It dials the configured bootstrap peers (zero
// for the first node) and returns once one of them answers; a full
// routing-table refresh then runs in the background and the overlay reports
// Ready. Health and Status give the routing-table size, the time since the
// last refresh and the ready flag.
//
// The library's refresh (every 10 minutes) is tuned for the public IPFS
// network. Here the overlay drives refreshes itself (DisableAutoRefresh):
// one forced refresh at join, then one every RefreshInterval (1 minute),
// which refreshes only buckets not touched by a lookup in that time and
// pings peers not heard from. Between refreshes it runs random-key lookups
// ("walks") every WalkInterval (5 s, 2 s during a 20-s warm-up after the
// join). Walks are what let a node learn the whole population and what feed
// the order-statistics estimator. If the routing table ever empties, the
// overlay dials the bootstrap peers again.
//
// With KeepJoining, an overlay whose bootstrap peers do not answer at
// first starts alone, and a joiner dials them again with exponential
// backoff and jitter until one answers; once joined it watches the routing
// table, and now and then dials a bootstrap peer it holds no live member
// of, so that two halves of a job that kept one bootstrap peer each meet
// again (Config.Join, join.go; JoinStatus says how it goes). With a
// PeersFile it keeps the peers it knows there, and a restarted overlay
// joins through those that answer besides its bootstrap peers
// (peersfile.go).
//
// Walks and refreshes are made of our own lookups over the DHT protocol
// (walk.go), not the library's: they start from the closest peers the whole
// member set knows and stop by Kademlia's rule (the Resiliency closest peers
// heard of have answered) without the library's follow-up to all k closest,
// so a lookup costs about 3 FIND_NODE requests instead of about 25. A
// refresh is a lookup for our own key, one per stale bucket, and a
// FIND_NODE to each routing-table peer not heard from for the library's
// threshold (18 periods), which leaves the table if it does not answer.
// Every DHT request, ours and the library's, goes on a stream of its own
// that is closed with the reply (rpc.go): the library's sender keeps a
// stream open to every peer it has queried, which at hundreds of nodes in
// one process held most of the memory.
//
// # Estimator
//
// Estimate returns N̂ (self included) with a standard error, or an error
// wrapping ErrTooFewPeers when there is too little data. It fuses three
// sources:
//
//   - Zone density. Known live peers are counted by common prefix length
//     (CPL) with self. A routing-table bucket holding fewer than k peers is
//     complete, so every zone below the deepest full bucket is completely
//     known. The zone depth c is one level deeper still (the first bucket
//     that is not full reads N low), or that first bucket when the deeper
//     zone holds fewer than MinZonePeers, and N̂ = 1 + 2^c·n_c with
//     standard error 2^c·√n_c (n_c is Poisson). Departed peers are
//     excluded: the overlay keeps connections to its zone peers, so their
//     departure is seen at once.
//   - Order statistics of random-key lookups (the idea behind kad-dht's
//     netsize package). For a uniform key the normalised XOR distance to the
//     k-th closest of the other N−1 IDs is about Gamma(k, N−1), so over the
//     walks of the last EstimateWindow (at most the MaxLookups most recent)
//     N̂ − 1 = (Σk − 1)/Σd_k, unbiased, with relative error 1/√(Σk − 2):
//     about 8 % for eight walks. It corrects the zone estimator, which reads
//     low when the routing table misses peers and is coarse (relative error
//     ≈ 1/√n_c ≈ 20 %). The cap makes the window short during the warm-up's
//     fast walks, so lookups made while the network was still forming stop
//     counting within seconds; refresh lookups, whose keys are ours and
//     which run at the join, are not counted. A peer counts among a
//     lookup's closest only if it answered, was heard from first-hand
//     before, or was named by two of the peers that answered: one peer
//     that names made-up IDs near the key would otherwise fill the
//     closest and read the network many times too large.
//   - Reports from peers (ObserveEstimate), which the node's step replies
//     carry. The latest report per peer counts for ReportMaxAge; those
//     within a factor of ReportBand of the reports' median (the local
//     estimate voting too, as many times as half the known peers that
//     have not reported, so that liars quick to report cannot hold the
//     median early on) count, and their 10 % trimmed mean is averaged
//     with the local estimate with weight m : 1 (every node estimates from
//     a different zone and different lookups, so the errors are roughly
//     independent), shrinking the error by √(1+m). One report per peer
//     and the band keep liars that report often and far off from moving
//     it. PeerReports hands the latest report per peer, with how long the
//     peer has been reporting, to a caller that weighs them itself (the
//     node's population rule, psp.Population, does).
//
// LocalEstimate is the first two fused by inverse variance; peers should
// report LocalEstimate, not Estimate, to keep reports independent.
//
// # Sampler
//
// PSP's barrier check draws β peers uniformly at random, without
// replacement, from the whole population, and a node that must wait checks
// again with a fresh sample. Sample(ctx, β) does that over the peers this
// node knows to be alive, in microseconds and without network I/O: every
// call is a new uniform draw from every drawable peer, independent of the
// calls before it (a partial shuffle of the peers heard from first-hand:
// about β random picks whatever N, and whatever other nodes name). A known
// peer is drawable when it has shown first-hand signs of life (see
// Liveness) and either
//
//   - a connection to it is open: its departure would close the connection,
//     which the host reports at once; or
//   - its last first-hand evidence of life is younger than LivenessWindow
//     (20 s).
//
// A lagging peer is thus in any one of a node's samples with probability
// β/D, D the number of drawable peers, whatever was drawn before. Drawing
// from a small set instead is uniform on average but correlates a node's
// successive checks: with a pool of 32 of 200 nodes that rotates one member
// every 2 s, a lagging pool member is in each sample with probability
// 10/32 rather than 10/199, holds its holders back check after check, and
// measured on the virtual clock cost pBSP(10) about 5 % of its pace
// against the simulator. Drawable peers come from everything that shows a
// peer alive: connections (the pool's, the zone's, peers that connect to
// us), the node's own traffic (every step query answered, every query
// received: MarkAlive) and the peers that answer our walks. Sample fails
// with ErrNotEnoughPeers when fewer than β are drawable. Peers returns
// every known peer with first-hand signs of life at any time, for "BSP =
// sample everyone I know".
//
// The pool. PoolSize (64) peers are kept connected and verified: a uniform
// random subset of every known live peer, kept so by reservoir sampling
// over the stream of new members (while the pool has room every peer
// enters; after that a new peer enters with probability PoolSize/|members|
// replacing a uniform pool member, so early discoveries are not favoured)
// and by swapping a uniform pool member for a uniform non-pool member every
// RotateInterval (2 s). A peer enters only after a successful probe, a
// pool join (/psp/<job>/pool/1.0.0, pool.go), and the connection is then
// protected in the connection manager by both ends. Pool members are always
// drawable, so Sample has at least PoolSize peers to draw from however
// quiet the node is, and their departures are seen at once; each rotation
// is also a probe of a uniformly chosen peer. The join's reply carries the
// peer's in-degree (how many pools hold it, Status.InDegree), reported for
// monitoring; no draw is weighted by it.
//
// What a node knows is not a uniform subset of the population when it
// does not know everyone: it knows every peer near it in the ID space (its
// zone and deep routing-table buckets) but only some of the far ones, and
// it hears from peers that contact it. Sample nevertheless gives every
// drawable peer the same weight (apart from the address limits below).
// Weights that restored each region of the ID space to its share of the
// population (the inverse of the share of that region that is drawable)
// would draw the far peers a node knows more often, in the same
// proportion as they are under-represented: the peer most likely to be in
// any one sample, which is what correlates successive checks, would be
// drawn more often, not less, and a peer's speed does not depend on its
// ID, so the barrier gains nothing from the region's share.
// Equal weights minimise the largest chance any one peer has to be in a
// sample (β/D); the way to bring D towards N is to know more peers, which
// the walks do (members/N reaches about 1 at a few hundred nodes within a
// minute). docs/overlay.md has the harness's measurement of the draws by common
// prefix length with the drawer.
//
// Address limits. Identities cost one key each, and many can run behind
// one network address (a Sybil attack). With PerAddress (1 by default),
// Sample draws each of n > PerAddress live peers that connect from one
// address with weight PerAddress/n and at most PerAddress of them into one
// sample, so together they weigh what one peer does, and the DHT's routing table (kad-dht's RoutingTablePeerDiversity-
// Filter) admits at most one of them per bucket and two in all. The
// address is the connection's remote address (an IPv4 address, an IPv6
// /64), narrower than kbucket's peerdiversity groups (IPv4 /16, IPv6 by
// autonomous system), which would let one data centre's nodes fill two
// places in the table; loopback addresses are exempt (diversity.go). An
// attacker who instead grinds keys near a victim's ID crowds its zone;
// the zone estimator then reads high, and the order statistics of
// random-key lookups and the peers' reports, which Sybils packed near a
// few victims barely touch, carry the fused estimate (docs/reliability.md
// has the measurements).
//
// Every random choice the overlay makes (the pool's draws, Sample, walk and
// refresh keys, which dead peers to dial again, the jitter of its periods)
// comes from streams seeded by Config.Seed, or from crypto/rand when Seed
// is 0 (random.go).
//
// # Liveness
//
// Evidence of life is first-hand only: a peer answered one of our queries,
// completed identify advertising our DHT protocol, connected to us, or the
// node reported it with MarkAlive. A departed peer stops being drawn
// without anyone probing it: its connections close (which makes it
// undrawable unless it was heard from within LivenessWindow), and a peer
// we hold no connection to ages out LivenessWindow after its last
// evidence. So no departed peer is drawn more than LivenessWindow after it
// was last heard from, at no cost in probes whatever N. When a pool or zone
// peer disconnects it is probed as well (dialled, ProbeTimeout 3 s), and a
// failed probe marks it dead. MarkDead (the node calls it when a step query
// fails) does the same without probing: a departed peer that the node
// draws within LivenessWindow costs one failed query and a replacement
// draw. A dead peer leaves the pool (which is refilled), the routing table
// and the reports. Other nodes' stale routing tables keep naming departed
// peers, so third-party sightings are ignored for DeadHold (2 minutes);
// first-hand evidence revives a peer at once, so rejoining peers return.
//
// A third-party sighting costs the naming peer nothing, so what it adds is
// bounded: at most MaxUnconfirmed (256) peers are known only that way,
// kept in order of their last sighting, and past the bound the one
// sighted least recently is forgotten. Such a peer is never drawn, does
// not count for the zone estimator or the address limits, and is held
// dead when it fails a lookup query or a probe (it is not dialled again:
// a real one is named again); it becomes an ordinary member on first-hand
// evidence. A peer that answers lookups with made-up IDs thus costs each
// node at most MaxUnconfirmed entries and some failed queries
// (docs/reliability.md has the fake-peers measurements).
//
// # Scale
//
// With library defaults, hundreds of nodes in one process exhaust memory
// or CPU. What keeps a thousand nodes in one process cheap: no provider or
// value stores; refresh and walks on our schedule; connections only to the
// pool, the zone and the peers of current lookups, with a connection
// manager trimming the rest (the node should give its host one, e.g.
// connmgr.NewConnManager(150, 250)); in the mocknet harness, links created
// on first dial instead of LinkAll's N². docs/overlay.md has the measurements.
package overlay
