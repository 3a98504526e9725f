package testnet

import (
	"io"
	"math"
	"math/rand/v2"
	"net"
	"slices"

	kb "github.com/libp2p/go-libp2p-kbucket"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/testnet/plan"
	"github.com/pspnode/pspnode/testnet/report"
	"github.com/pspnode/pspnode/testnet/sim"
)

// identity is a node's key and address on the mem transport; zero values
// take the network's next key and a fresh address.
type identity struct {
	key crypto.PrivKey
	ip  net.IP
	// keygens is how many keys were generated to find key (sybil-zone).
	keygens int
	// via, if set, are the members a joiner bootstraps through, alone: a
	// probe of joiner-wedge nodes, whose figures are reported apart.
	via []*member
}

// sybilState is what the testnet knows of its Sybils.
type sybilState struct {
	keys    io.Reader        // sybil-zone key stream
	hostIP  net.IP           // the address every sybil-host node shares
	victims map[peer.ID]bool // honest nodes the sybil-zone nodes crowd
	keygens []int            // keys generated per sybil-zone node
	addrs   map[string]bool  // IP addresses of the initial nodes
	sybAddr map[string]bool  // those of Sybils
	ids     int              // Sybil identities at the start
	// draws counts the peers honest nodes drew (guarded by
	// testnet.sampledMu); errs the victims' errors at every record
	// (guarded by testnet.mu).
	draws struct{ all, sybil, victimAll, victimSybil int }
	errs  struct{ est, zone []float64 }
}

// chooseVictims picks the sybil-zone victims among the honest members by
// the seed.
func (t *testnet) chooseVictims() {
	var honest []*member
	for _, m := range t.members {
		if m.role == plan.Honest {
			honest = append(honest, m)
		}
	}
	r := rand.New(rand.NewPCG(t.cfg.Seed, 0x5b11))
	k := min(t.cfg.SybilVictimCount(), len(honest))
	for _, j := range r.Perm(len(honest))[:k] {
		t.syb.victims[honest[j].nd.ID()] = true
	}
}

// sybilIdentity returns the identity of a sybil-zone node (its key ground
// against victim) or of a sybil-host node (the shared address).
func (t *testnet) sybilIdentity(role plan.Role, victim peer.ID) (identity, error) {
	if role == plan.SybilHost {
		if t.syb.hostIP == nil {
			t.syb.hostIP = t.net.NewIP()
		}
		return identity{ip: t.syb.hostIP}, nil
	}
	return grindKey(t.syb.keys, kb.ConvertPeerID(victim), t.cfg.SybilPrefixBits())
}

// grindKey generates Ed25519 keys from keys until one's DHT key shares at
// least bits leading bits with target (2^bits tries on average), or, after
// 64 × 2^bits tries, returns the closest found.
func grindKey(keys io.Reader, target kb.ID, bits int) (identity, error) {
	var best identity
	bestCPL := -1
	limit := 64 << bits
	for n := 1; n <= limit; n++ {
		sk, _, err := crypto.GenerateEd25519Key(keys)
		if err != nil {
			return identity{}, err
		}
		id, err := peer.IDFromPrivateKey(sk)
		if err != nil {
			return identity{}, err
		}
		if c := kb.CommonPrefixLen(kb.ConvertPeerID(id), target); c > bestCPL {
			best, bestCPL = identity{key: sk, keygens: n}, c
			if c >= bits {
				return best, nil
			}
		}
	}
	best.keygens = limit
	return best, nil
}

// recordVictim records a victim's estimate error rel and that of its zone
// estimator alone against the true population truth; t.mu is held.
func (t *testnet) recordVictim(m *member, rel, truth float64) {
	t.syb.errs.est = append(t.syb.errs.est, rel)
	z := 1.0 // no zone estimate counts as 100 % off
	if d := m.nd.Overlay().EstimateDetail(); d.ZoneN > 0 {
		z = math.Abs(d.ZoneN-truth) / truth
	}
	t.syb.errs.zone = append(t.syb.errs.zone, z)
}

// countDraws adds a barrier sample drawn by an honest node to the Sybil
// figures; t.sampledMu is held.
func (t *testnet) countDraws(drawer peer.ID, peers []peer.ID) {
	if t.syb == nil {
		return
	}
	victim := t.syb.victims[drawer]
	for _, p := range peers {
		r, ok := t.roleOf.Load(p)
		s := ok && r.(plan.Role).Sybil()
		t.syb.draws.all++
		if s {
			t.syb.draws.sybil++
		}
		if victim {
			t.syb.draws.victimAll++
			if s {
				t.syb.draws.victimSybil++
			}
		}
	}
}

// sybilFigures computes the figures; t.mu must be held.
func (t *testnet) sybilFigures() *report.SybilFigures {
	s := t.syb
	if s == nil {
		return nil
	}
	f := &report.SybilFigures{Defence: !t.cfg.NoSybilDefence, Victims: len(s.victims)}
	if n := t.cfg.Nodes; n > 0 {
		f.IDShare = float64(s.ids) / float64(n)
	}
	if len(s.addrs) > 0 {
		f.AddrShare = float64(len(s.sybAddr)) / float64(len(s.addrs))
	}
	t.sampledMu.Lock()
	if s.draws.all > 0 {
		f.SampleShare = float64(s.draws.sybil) / float64(s.draws.all)
	}
	if s.draws.victimAll > 0 {
		f.VictimSampleShare = float64(s.draws.victimSybil) / float64(s.draws.victimAll)
	}
	f.HonestDraws = s.draws.all
	t.sampledMu.Unlock()
	if len(s.errs.est) > 0 {
		e, z := slices.Clone(s.errs.est), slices.Clone(s.errs.zone)
		slices.Sort(e)
		slices.Sort(z)
		f.VictimError, f.VictimErrorP95 = sim.Percentile(e, 50), sim.Percentile(e, 95)
		f.VictimZoneError = sim.Percentile(z, 50)
	}
	if len(s.keygens) > 0 {
		f.PrefixBits = t.cfg.SybilPrefixBits()
		sum := 0
		for _, k := range s.keygens {
			sum += k
		}
		f.KeygensMean = float64(sum) / float64(len(s.keygens))
	}
	return f
}
