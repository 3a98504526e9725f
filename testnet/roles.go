package testnet

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/gossip"
	"github.com/pspnode/pspnode/internal/faults"
	"github.com/pspnode/pspnode/internal/wire"
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

// invalidPoison reports whether r's updates must never be applied by an
// honest node (they fail validation).
func (r Role) invalidPoison() bool {
	return r == PoisonNaN || r == PoisonHuge || r == PoisonLength
}

func (r Role) poisoner() bool { return r.invalidPoison() || r == PoisonNorm }

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

// assignRoles gives round(F·N) of the n initial nodes each role, chosen by
// the seed, never the same node twice.
func assignRoles(n int, shares []RoleShare, seed uint64) []Role {
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

// faults returns the node faults that play role r. self is filled in once
// the node's peer ID is known (poisoned messages carry it).
func (t *testnet) faults(r Role, seed uint64, self *peer.ID, params int, modelID uint32) faults.Node {
	honest := r == Honest
	f := faults.Node{Loss: t.cfg.Loss, OnSample: func(peers []peer.ID) { t.countSample(*self, honest, peers) }}
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(seed, 0x11a5))
	switch r {
	case LiarAhead:
		f.StepLie = func(s int64) int64 { return s + 1_000_000 }
	case LiarZero:
		f.StepLie = func(int64) int64 { return 0 }
	case LiarRandom:
		f.StepLie = func(s int64) int64 {
			mu.Lock()
			defer mu.Unlock()
			return rng.Int64N(2*s + 11)
		}
	case Slow:
		f.ReplyDelay = t.cfg.SlowDelay
	case DriftPoison:
		// Its own models are not sent: only the poisoned ones (drift).
		f.Poison = func(int64, []float64) []byte { return nil }
	case PoisonNaN, PoisonHuge, PoisonLength, PoisonNorm:
		f.Poison = func(step int64, delta []float64) []byte {
			u := &gossip.Update{Sender: *self, Step: step, ModelID: modelID, ParamCount: params, Encoding: gossip.EncodingDense32}
			u.Values = make([]float32, params)
			for i, d := range delta {
				switch r {
				case PoisonNaN:
					u.Values[i] = float32(math.NaN())
				case PoisonHuge:
					u.Values[i] = 1e30
				default:
					u.Values[i] = float32(-100 * d)
				}
			}
			if r == PoisonLength {
				u.ParamCount++
				u.Values = append(u.Values, 0)
			}
			b, err := gossip.EncodeUpdate(nil, u)
			if err != nil {
				return nil
			}
			return b
		}
	}
	return f
}

// floodPause is the least time between two streams of one flood worker:
// 32 workers open at most 6 400 streams a second. Without a pause a worker
// whose stream is refused at once would loop without ever waiting, which on
// the virtual clock (where CPU work takes no time) is an attack of infinite
// rate that stops the clock.
const floodPause = 5 * time.Millisecond

// flood is a flooder's attack on the target, until ctx ends: 32 workers
// that each open a step stream, announce a frame far over the size cap (or
// send half a frame and stall), and start again after floodPause; and junk
// updates of the largest allowed size, 20 a second.
func (t *testnet) flood(ctx context.Context, m *member, target peer.ID) {
	h := m.nd.Host()
	proto := wire.StepProtocol("testnet")
	var wg sync.WaitGroup
	for w := range 32 {
		wg.Go(func() {
			var hdr [binary.MaxVarintLen64]byte
			for ctx.Err() == nil {
				sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				s, err := h.NewStream(sctx, target, proto)
				if err != nil {
					cancel()
					sleepCtx(ctx, 50*time.Millisecond)
					continue
				}
				sleepCtx(ctx, floodPause)
				if w%2 == 0 {
					k := binary.PutUvarint(hdr[:], 1<<30) // a 1 GiB frame
					_, _ = s.Write(append(hdr[:k], make([]byte, 4096)...))
					_ = s.Reset()
				} else {
					k := binary.PutUvarint(hdr[:], 64)
					_, _ = s.Write(hdr[:k]) // and then nothing
					<-sctx.Done()
					_ = s.Reset()
				}
				cancel()
			}
		})
	}
	if g := m.nd.Gossip(); g != nil {
		size := gossip.MaxEncodedSize(m.nd.Model().NumParams())
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ctx.Err() == nil; i++ {
			select {
			case <-ctx.Done():
			case <-tick.C:
				// A fresh buffer each time: GossipSub may still be sending
				// the previous message when the next is published.
				junk := make([]byte, size)
				binary.LittleEndian.PutUint64(junk, uint64(i)) // distinct messages
				_ = faults.PublishRaw(g, ctx, junk)
			}
		}
	}
	wg.Wait()
}

// slowModelStreams is how many model streams a slow-model node holds on
// its target at once.
const slowModelStreams = 8

// slowModel is a slow-model node's attack on the target, until ctx ends
// (see SlowModel).
func (t *testnet) slowModel(ctx context.Context, m *member, target peer.ID) {
	h := m.nd.Host()
	proto := wire.ModelProtocol("testnet")
	var wg sync.WaitGroup
	for range slowModelStreams {
		wg.Go(func() {
			buf := make([]byte, 1)
			for ctx.Err() == nil {
				s, err := h.NewStream(ctx, target, proto)
				if err != nil {
					sleepCtx(ctx, time.Second)
					continue
				}
				stop := context.AfterFunc(ctx, func() { _ = s.Reset() })
				start := time.Now()
				_, _ = s.Write([]byte{1}) // a frame of one byte follows; it never does
				_, _ = s.Read(buf)        // until the target resets the stream
				_ = s.Reset()
				stop()
				if time.Since(start) < time.Second {
					sleepCtx(ctx, time.Second) // refused at once: try again later
				} else {
					sleepCtx(ctx, floodPause)
				}
			}
		})
	}
	wg.Wait()
}

func sleepCtx(ctx context.Context, d time.Duration) {
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-ctx.Done():
	case <-tm.C:
	}
}
