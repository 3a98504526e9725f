package hostile

import (
	"io"
	"maps"
	"math"
	"math/rand/v2"
	"net"
	"slices"
	"sync"

	kb "github.com/libp2p/go-libp2p-kbucket"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/internal/memnet"
	"github.com/pspnode/pspnode/node"
	"github.com/pspnode/pspnode/testnet/plan"
	"github.com/pspnode/pspnode/testnet/report"
	"github.com/pspnode/pspnode/testnet/sim"
)

// Identity is a node's key and address on the mem transport; zero values
// take the network's next key and a fresh address.
type Identity struct {
	Key crypto.PrivKey
	IP  net.IP
	// Keygens is how many keys were generated to find Key (sybil-zone).
	Keygens int
}

// sybilState is what the testnet knows of its Sybils. mu guards it all:
// honest nodes add their draws at every barrier check, the recorder the
// victims' errors at every record.
type sybilState struct {
	mu      sync.Mutex
	keys    io.Reader        // sybil-zone key stream
	hostIP  net.IP           // the address every sybil-host node shares
	victims map[peer.ID]bool // honest nodes the sybil-zone nodes crowd
	keygens []int            // keys generated per sybil-zone node
	addrs   map[string]bool  // IP addresses of the initial nodes
	sybAddr map[string]bool  // those of Sybils
	ids     int              // Sybil identities at the start
	// draws counts the peers honest nodes drew; errs the victims' errors
	// at every record.
	draws struct{ all, sybil, victimAll, victimSybil int }
	errs  struct{ est, zone []float64 }
}

func newSybilState(seed uint64) *sybilState {
	return &sybilState{
		keys:    memnet.KeySource(seed, "testnet sybil keys"),
		victims: make(map[peer.ID]bool),
		addrs:   make(map[string]bool),
		sybAddr: make(map[string]bool),
	}
}

// ChooseVictims picks the sybil-zone victims among the honest nodes by
// the seed, and returns them in order.
func (p *Play) ChooseVictims(honest []peer.ID) []peer.ID {
	s := p.syb
	s.mu.Lock()
	defer s.mu.Unlock()
	r := rand.New(rand.NewPCG(p.cfg.Seed, 0x5b11))
	k := min(p.cfg.SybilVictimCount(), len(honest))
	for _, j := range r.Perm(len(honest))[:k] {
		s.victims[honest[j]] = true
	}
	return slices.Sorted(maps.Keys(s.victims))
}

// SybilIdentity returns the identity of a new Sybil node of role: a
// sybil-zone node's key ground against victim, or a sybil-host node's
// shared address. The run counts it among its Sybils.
func (p *Play) SybilIdentity(role plan.Role, victim peer.ID) (Identity, error) {
	s := p.syb
	s.mu.Lock()
	defer s.mu.Unlock()
	if role == plan.SybilHost {
		if s.hostIP == nil {
			s.hostIP = p.mem.NewIP()
		}
		s.ids++
		return Identity{IP: s.hostIP}, nil
	}
	id, err := grindKey(s.keys, kb.ConvertPeerID(victim), p.cfg.SybilPrefixBits())
	if err == nil {
		s.keygens = append(s.keygens, id.Keygens)
		s.ids++
	}
	return id, err
}

// NoteAddrs notes the IP addresses of an initial node for the Sybil
// figures (sybil: it is a Sybil). A no-op without Sybil roles.
func (p *Play) NoteAddrs(ips []string, sybil bool) {
	s := p.syb
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ip := range ips {
		s.addrs[ip] = true
		if sybil {
			s.sybAddr[ip] = true
		}
	}
}

// IsVictim reports whether id is a sybil-zone victim.
func (p *Play) IsVictim(id peer.ID) bool {
	s := p.syb
	if s == nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.victims[id]
}

// grindKey generates Ed25519 keys from keys until one's DHT key shares at
// least bits leading bits with target (2^bits tries on average), or, after
// 64 × 2^bits tries, returns the closest found.
func grindKey(keys io.Reader, target kb.ID, bits int) (Identity, error) {
	var best Identity
	bestCPL := -1
	limit := 64 << bits
	for n := 1; n <= limit; n++ {
		sk, _, err := crypto.GenerateEd25519Key(keys)
		if err != nil {
			return Identity{}, err
		}
		id, err := peer.IDFromPrivateKey(sk)
		if err != nil {
			return Identity{}, err
		}
		if c := kb.CommonPrefixLen(kb.ConvertPeerID(id), target); c > bestCPL {
			best, bestCPL = Identity{Key: sk, Keygens: n}, c
			if c >= bits {
				return best, nil
			}
		}
	}
	best.Keygens = limit
	return best, nil
}

// RecordVictim records a victim's estimate error rel and that of its zone
// estimator alone against the true population truth.
func (p *Play) RecordVictim(nd *node.Node, rel, truth float64) {
	z := 1.0 // no zone estimate counts as 100 % off
	if d := nd.Overlay().EstimateDetail(); d.ZoneN > 0 {
		z = math.Abs(d.ZoneN-truth) / truth
	}
	s := p.syb
	s.mu.Lock()
	defer s.mu.Unlock()
	s.errs.est = append(s.errs.est, rel)
	s.errs.zone = append(s.errs.zone, z)
}

// CountDraws adds a barrier sample drawn by an honest node to the Sybil
// figures. A no-op without Sybil roles.
func (p *Play) CountDraws(drawer peer.ID, peers []peer.ID) {
	s := p.syb
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	victim := s.victims[drawer]
	for _, q := range peers {
		r, ok := p.net.RoleOf(q)
		sybil := ok && r.Sybil()
		s.draws.all++
		if sybil {
			s.draws.sybil++
		}
		if victim {
			s.draws.victimAll++
			if sybil {
				s.draws.victimSybil++
			}
		}
	}
}

// sybilFigures computes the figures, nil without Sybil roles.
func (p *Play) sybilFigures() *report.SybilFigures {
	s := p.syb
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	f := &report.SybilFigures{Defence: !p.cfg.NoSybilDefence, Victims: len(s.victims)}
	if n := p.cfg.Nodes; n > 0 {
		f.IDShare = float64(s.ids) / float64(n)
	}
	if len(s.addrs) > 0 {
		f.AddrShare = float64(len(s.sybAddr)) / float64(len(s.addrs))
	}
	if s.draws.all > 0 {
		f.SampleShare = float64(s.draws.sybil) / float64(s.draws.all)
	}
	if s.draws.victimAll > 0 {
		f.VictimSampleShare = float64(s.draws.victimSybil) / float64(s.draws.victimAll)
	}
	f.HonestDraws = s.draws.all
	if len(s.errs.est) > 0 {
		e, z := slices.Clone(s.errs.est), slices.Clone(s.errs.zone)
		slices.Sort(e)
		slices.Sort(z)
		f.VictimError, f.VictimErrorP95 = sim.Percentile(e, 50), sim.Percentile(e, 95)
		f.VictimZoneError = sim.Percentile(z, 50)
	}
	if len(s.keygens) > 0 {
		f.PrefixBits = p.cfg.SybilPrefixBits()
		sum := 0
		for _, k := range s.keygens {
			sum += k
		}
		f.KeygensMean = float64(sum) / float64(len(s.keygens))
	}
	return f
}
