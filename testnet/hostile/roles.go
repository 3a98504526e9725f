package hostile

import (
	"context"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/gossip"
	"github.com/pspnode/pspnode/internal/faults"
	"github.com/pspnode/pspnode/internal/vclock"
	"github.com/pspnode/pspnode/internal/wire"
	"github.com/pspnode/pspnode/node"
	"github.com/pspnode/pspnode/testnet/plan"
)

// Faults returns the node faults that play role r (and the run's Loss).
// self is filled in once the node's peer ID is known (poisoned messages
// carry it). OnSample is left to the caller.
func (p *Play) Faults(r plan.Role, seed uint64, self *peer.ID, params int, modelID uint32) faults.Node {
	f := faults.Node{Loss: p.cfg.Loss}
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(seed, 0x11a5))
	switch r {
	case plan.LiarAhead:
		f.StepLie = func(s int64) int64 { return s + 1_000_000 }
	case plan.LiarZero:
		f.StepLie = func(int64) int64 { return 0 }
	case plan.LiarRandom:
		f.StepLie = func(s int64) int64 {
			mu.Lock()
			defer mu.Unlock()
			return rng.Int64N(2*s + 11)
		}
	case plan.Slow:
		f.ReplyDelay = p.cfg.SlowDelay
	case plan.DriftPoison:
		// Its own models are not sent: only the poisoned ones (drift).
		f.Poison = func(int64, []float32) []byte { return nil }
	case plan.PoisonNaN, plan.PoisonHuge, plan.PoisonLength, plan.PoisonNorm:
		f.Poison = func(step int64, delta []float32) []byte {
			u := &gossip.Update{Sender: *self, Step: step, ModelID: modelID, ParamCount: params, Encoding: gossip.EncodingDense32}
			u.Values = make([]float32, params)
			for i, d := range delta {
				switch r {
				case plan.PoisonNaN:
					u.Values[i] = float32(math.NaN())
				case plan.PoisonHuge:
					u.Values[i] = 1e30
				default:
					u.Values[i] = -100 * d
				}
			}
			if r == plan.PoisonLength {
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
func (p *Play) flood(ctx context.Context, nd *node.Node, target peer.ID) {
	h := nd.Host()
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
					vclock.Sleep(ctx, 50*time.Millisecond)
					continue
				}
				vclock.Sleep(ctx, floodPause)
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
	if g := nd.Gossip(); g != nil {
		size := gossip.MaxEncodedSize(nd.Model().NumParams())
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
func (p *Play) slowModel(ctx context.Context, nd *node.Node, target peer.ID) {
	h := nd.Host()
	proto := wire.ModelProtocol("testnet")
	var wg sync.WaitGroup
	for range slowModelStreams {
		wg.Go(func() {
			buf := make([]byte, 1)
			for ctx.Err() == nil {
				s, err := h.NewStream(ctx, target, proto)
				if err != nil {
					vclock.Sleep(ctx, time.Second)
					continue
				}
				stop := context.AfterFunc(ctx, func() { _ = s.Reset() })
				start := time.Now()
				_, _ = s.Write([]byte{1}) // a frame of one byte follows; it never does
				_, _ = s.Read(buf)        // until the target resets the stream
				_ = s.Reset()
				stop()
				if time.Since(start) < time.Second {
					vclock.Sleep(ctx, time.Second) // refused at once: try again later
				} else {
					vclock.Sleep(ctx, floodPause)
				}
			}
		})
	}
	wg.Wait()
}
