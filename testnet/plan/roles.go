package plan

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
)

// Role is how a testnet node misbehaves. Hostile nodes train like the
// others (their true steps advance under the barrier) and misbehave in one
// way each; the result's step figures cover the honest nodes only.
type Role string

// The roles. Honest is the zero value.
const (
	Honest Role = ""
	// Step liars answer step queries with a false step.
	LiarAhead  Role = "liar-ahead"  // true step + 1 000 000
	LiarZero   Role = "liar-zero"   // always 0
	LiarRandom Role = "liar-random" // uniform in [0, 2·step+10], fresh each time
	// Update poisoners publish bad updates instead of their own.
	PoisonNaN    Role = "poison-nan"    // NaN values
	PoisonHuge   Role = "poison-huge"   // values of 1e30
	PoisonLength Role = "poison-length" // one value too many
	PoisonNorm   Role = "poison-norm"   // valid-looking: the update × -100
	// A flooder opens many step streams to one target node (32 workers,
	// each at most one stream every floodPause), sends frames over the size
	// cap or stalls mid-frame, and publishes junk updates.
	Flooder Role = "flooder"
	// Slow peers answer step queries after Config.SlowDelay.
	Slow Role = "slow"
	// A slow-model node holds model streams open on the same target as
	// the flooders: 8 workers (the per-peer cap of step streams) that each
	// open a model stream, announce a one-byte request and never send it,
	// so that the stream lasts until the target's deadline (10 ×
	// QueryTimeout) resets it, and then open another (after a second if
	// the target refused it at once). 64 of them held all 512 inbound
	// slots the model protocol shared with step queries.
	SlowModel Role = "slow-model"
)

// Roles lists every hostile or faulty role.
var Roles = []Role{LiarAhead, LiarZero, LiarRandom, PoisonNaN, PoisonHuge, PoisonLength, PoisonNorm, Flooder, Slow, SlowModel, SybilZone, SybilHost, FakePeers,
	LineageHijack, JoinerWedge, DriftPoison, EstimateLiar, StreamHog, ConnHog, LogFlood}

// InvalidPoison reports whether r's updates must never be applied by an
// honest node (they fail validation).
func (r Role) InvalidPoison() bool {
	return r == PoisonNaN || r == PoisonHuge || r == PoisonLength
}

// Poisoner reports whether r publishes poisoned updates.
func (r Role) Poisoner() bool { return r.InvalidPoison() || r == PoisonNorm }

// RoleShare is a fraction of the initial nodes that play a role.
type RoleShare struct {
	Role     Role
	Fraction float64
}

// ParseRoles reads a comma-separated list of ROLE:SHARE, where SHARE is a
// percentage ("5%") or a fraction ("0.05") of the initial nodes, strictly
// between 0 and 1, e.g. "liar-zero:5%,poison-nan:5%". The shares must add
// up to less than 1: some nodes stay honest, or there is nothing to
// measure.
func ParseRoles(s string) ([]RoleShare, error) {
	var out []RoleShare
	total := 0.0
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, share, ok := strings.Cut(part, ":")
		if !ok {
			return nil, fmt.Errorf("role %q: want ROLE:SHARE, e.g. liar-zero:5%%", part)
		}
		r := Role(name)
		if !slices.Contains(Roles, r) {
			names := make([]string, len(Roles))
			for i, r := range Roles {
				names[i] = string(r)
			}
			return nil, fmt.Errorf("role %q: want one of %s", name, strings.Join(names, ", "))
		}
		f, err := parseShare(share)
		if err != nil {
			return nil, fmt.Errorf("role %s: %w", name, err)
		}
		total += f
		out = append(out, RoleShare{r, f})
	}
	if total >= 1 {
		return nil, fmt.Errorf("role shares add up to %.3g: some nodes must stay honest", total)
	}
	return out, nil
}

func parseShare(s string) (float64, error) {
	pct, isPct := strings.CutSuffix(s, "%")
	v, err := strconv.ParseFloat(pct, 64)
	if isPct {
		v /= 100
	}
	if err != nil || !(v > 0 && v < 1) {
		return 0, fmt.Errorf("share %q: want a percentage in (0, 100%%) or a fraction in (0, 1)", s)
	}
	return v, nil
}

// FormatRoles renders shares in ParseRoles syntax.
func FormatRoles(rs []RoleShare) string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = fmt.Sprintf("%s:%g%%", r.Role, 100*r.Fraction)
	}
	return strings.Join(parts, ",")
}

// AssignRoles gives round(F·N) of the n initial nodes each role, chosen by
// the seed, never the same node twice.
func AssignRoles(n int, shares []RoleShare, seed uint64) []Role {
	out := make([]Role, n)
	order := rand.New(rand.NewPCG(seed, 0x7015)).Perm(n)
	next := 0
	for _, s := range shares {
		k := int(math.Round(s.Fraction * float64(n)))
		for ; k > 0 && next < n; k-- {
			out[order[next]] = s.Role
			next++
		}
	}
	return out
}

// Impostors: roles that speak the job's protocols as an outside peer
// would, from the bytes docs/protocols.md specifies, in place of (or
// beside) their own node. Each is one node of the testnet whose step and
// model handlers the role replaces; the node itself still runs (it trains,
// and its overlay is what makes the impostor known to the honest nodes).
const (
	// LineageHijack trains as an honest node on the job's lineage until
	// hijackAfter into the run (so every honest node has known it there
	// for a while), then stops training and claims a lineage older than
	// any a node makes (a genesis of the Unix epoch), a new one each
	// hijackRound, each older than the last, with step HijackStep and a
	// model of every parameter HijackValue: in its answers to step
	// queries, in step queries it sends every peer it knows each
	// hijackEvery, and in its answers to model requests. The nodes of
	// the role claim the same lineage at once: k of them are k
	// identities, each on an address of its own. A node that follows the
	// lineage most of a sample is on, or the older genesis, moves onto
	// theirs at every round (a reset each time), takes its step and
	// model, and tells its own peers.
	LineageHijack Role = "lineage-hijack"
	// JoinerWedge copies the testnet's lineage, answers step queries with
	// step WedgeStep and model requests with every parameter WedgeValue.
	// A quarter into training (at most wedgeJoinAfter) the testnet starts
	// one fresh joiner per wedge node that bootstraps through it alone,
	// and, when there are several, one more through all of them: a joiner
	// that adopts the wedges' step can never pass its barrier again. Its DHT answers a peer with no closer peers
	// for wedgeEclipse after that peer's first request, then with the
	// closest its routing table holds: a joiner through it then knows it
	// alone when it asks for the job's step, as a joiner through a real
	// node's first peer usually does (in-process, the joiner's first
	// lookup was often done before it asked), and meets the job soon after.
	JoinerWedge Role = "joiner-wedge"
	// DriftPoison (epidemic exchange only) sends none of its own models;
	// instead it sends every honest peer it knows, as fast as the per-sender
	// cap lets it, that peer's own model moved in one fixed direction (all
	// parameters up) by a distance it fits to the peer's distance bound
	// from the peer's replies: ×1.5 after a model taken, ×0.6 after one
	// refused for distance. Values are clamped to 0.9 × MaxAbsValue.
	DriftPoison Role = "drift-poison"
	// EstimateLiar sends every honest peer it knows LiarQueryRate step
	// queries a second, on one stream each, on the job's lineage and with
	// its true step, each reporting a population of LiarEstimate (the
	// largest a node accepts): a node that keeps the last reports it heard
	// rather than one per peer hears mostly the liar.
	EstimateLiar Role = "estimate-liar"
)

// Sybil roles: many identities of one attacker, which otherwise behave
// honestly (they train, answer step queries truly and report their own
// estimates), so that only the honest nodes' population estimate and
// sampler are attacked.
const (
	// SybilZone nodes grind keys: each generates Ed25519 keys until its
	// DHT key (SHA-256 of the peer ID) shares at least SybilPrefix leading
	// bits with the key of its victim, one of SybilVictims honest nodes
	// chosen by the seed. They crowd the victims' zone of the ID space,
	// which the zone-density estimator reads as a dense (large) network.
	SybilZone Role = "sybil-zone"
	// SybilHost nodes are many identities behind one network address:
	// every one of them has the same IP.
	SybilHost Role = "sybil-host"
)

// Defaults of Config.SybilVictims and Config.SybilPrefix.
const (
	DefaultSybilVictims = 2
	// DefaultSybilPrefix bits cost 2^12 = 4 096 key generations per Sybil
	// on average (about 0.1 s of one core).
	DefaultSybilPrefix = 12
	// MaxSybilPrefix bounds the grinding: 2^20 key generations (about half
	// a minute of one core) per Sybil on average.
	MaxSybilPrefix = 20
)

// Sybil reports whether r is one of the Sybil roles.
func (r Role) Sybil() bool { return r == SybilZone || r == SybilHost }

// SybilVictimCount returns how many victims sybil-zone nodes have.
func (c Config) SybilVictimCount() int {
	if c.SybilVictims > 0 {
		return c.SybilVictims
	}
	return DefaultSybilVictims
}

// SybilPrefixBits returns how many leading bits a sybil-zone key shares
// with its victim's.
func (c Config) SybilPrefixBits() int {
	if c.SybilPrefix > 0 {
		return c.SybilPrefix
	}
	return DefaultSybilPrefix
}

// validateSybil checks the Sybil settings; bad reports each problem.
func (c Config) validateSybil(bad func(format string, a ...any)) {
	if c.SybilVictims < 0 {
		bad("sybil victims %d: want a number of honest nodes >= 1 (0: %d)", c.SybilVictims, DefaultSybilVictims)
	}
	if c.SybilPrefix < 0 || c.SybilPrefix > MaxSybilPrefix {
		bad("sybil prefix %d: want a number of bits in [1, %d] (0: %d)", c.SybilPrefix, MaxSybilPrefix, DefaultSybilPrefix)
	}
	sybils, honest := 0.0, 1.0
	zone := false
	for _, r := range c.Roles {
		honest -= r.Fraction
		if r.Role.Sybil() {
			sybils += r.Fraction
			zone = zone || r.Role == SybilZone
		}
	}
	if sybils == 0 {
		return
	}
	if c.Transport != "mem" {
		bad("sybil roles need the mem transport (it sets the nodes' keys and addresses)")
	}
	if zone && int(float64(c.Nodes)*honest+0.5) < c.SybilVictimCount() {
		bad("sybil-zone: %d victims, but only about %.0f honest nodes", c.SybilVictimCount(), float64(c.Nodes)*honest)
	}
}

// Hogs: roles that take a node's resources rather than lie, all aimed at
// the flood target (the first honest node), as the flooders' are. Their
// sizes are the attack's whole, shared among the nodes of the role: with
// one node it does all of it, with ten each does a tenth.
const (
	// StreamHog holds StreamHogPeers × MaxStreamsPerPeer (8) idle step
	// streams on the target, from StreamHogPeers identities of its own:
	// each opens a step stream, sends nothing, and opens another
	// floodPause after the target resets it (a quarter second after a
	// refusal). 640 streams against the target's 512 slots.
	StreamHog Role = "stream-hog"
	// ConnHog holds ConnHogPeers idle connections to the target, from
	// identities of its own that connect, do nothing, and connect again a
	// second after they are closed; on the TCP transport also
	// ConnHogHalfOpen half-open sockets (connected, never a byte of
	// handshake), each held until the target closes it or for 15 s,
	// then opened again.
	ConnHog Role = "conn-hog"
	// LogFlood (TCP transport, private job) opens junk connections to the
	// target as fast as 16 workers can (a few bytes that are no
	// handshake, then closed): each one is a refused handshake.
	LogFlood Role = "log-flood"
)

// FakePeers nodes answer every DHT request with FakePeersPerReply made-up
// peer IDs, fresh ones each time, each with an address nobody listens on:
// every lookup that asks one hears of peers that do not exist, which an
// overlay that keeps whatever it is told would add to its member set
// without end. They otherwise train and answer step queries honestly.
const FakePeers Role = "fake-peers"

// HasRole reports whether c gives a share of the nodes any of rs.
func (c Config) HasRole(rs ...Role) bool {
	for _, s := range c.Roles {
		if slices.Contains(rs, s.Role) {
			return true
		}
	}
	return false
}
