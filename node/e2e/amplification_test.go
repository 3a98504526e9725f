package e2e

import (
	"bufio"
	"context"
	"encoding/binary"
	"io"
	"testing"
	"time"

	pb "github.com/libp2p/go-libp2p-kad-dht/pb"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"google.golang.org/protobuf/proto"

	"github.com/pspnode/pspnode/internal/memnet"
	"github.com/pspnode/pspnode/internal/vclock"
	"github.com/pspnode/pspnode/internal/wire"
	"github.com/pspnode/pspnode/node"
	"github.com/pspnode/pspnode/node/exchange"
)

// counted is a stream whose payload bytes each way the test counts (the
// protocol negotiation, the same size each way, is not).
type counted struct {
	network.Stream
	in, out *int
}

func (c counted) Read(b []byte) (int, error) {
	n, err := c.Stream.Read(b)
	*c.in += n
	return n, err
}

func (c counted) Write(b []byte) (int, error) {
	n, err := c.Stream.Write(b)
	*c.out += n
	return n, err
}

// No protocol lets a peer make a node send much more than it sends: an
// attacker that speaks each of the node's protocols as cheaply as it can
// is sent at most the documented multiple of its own bytes (docs/
// protocols.md, section "Amplification"). The model protocol's answer is
// a model, so it is bounded per minute instead (wire.ModelPeerBudget);
// the trainer-state protocol's budget is node/trainer's
// TestStateLimitsBudget.
func TestAmplificationBounded(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		mn := memnet.New(0)
		t.Cleanup(func() { _ = mn.Close() })
		nodes := memNodesOn(t, mn, 4, "pssp:2:1", 0.01, func(c *node.Config) {
			c.Exchange.Spec = exchange.Spec{Kind: exchange.Epidemic, S: 2}
		})
		ctx, cancel := context.WithCancel(t.Context())
		wait := runAll(t, ctx, nodes)
		defer wait()
		defer cancel()
		if !waitFor(20*time.Second, func() bool { return minStep(nodes) >= 5 }) {
			t.Fatalf("nodes did not train: lowest step %d", minStep(nodes))
		}
		victim := nodes[0]
		h, err := mn.NewHost(10, 20)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = h.Close() })
		if err := h.Connect(t.Context(), peer.AddrInfo{ID: victim.ID(), Addrs: victim.Addrs()}); err != nil {
			t.Fatal(err)
		}
		job := "nodetest" // memNodes' job
		open := func(p protocol.ID, in, out *int) counted {
			s, err := h.NewStream(t.Context(), victim.ID(), p)
			if err != nil {
				t.Fatal(err)
			}
			_ = s.SetDeadline(time.Now().Add(10 * time.Second))
			return counted{s, in, out}
		}
		for _, tc := range []struct {
			name   string
			bound  float64 // bytes the node sends per byte the attacker does
			attack func(in, out *int)
		}{
			{"step 1.0.0, queries on one stream", 1.6, func(in, out *int) {
				s := open(wire.StepProtocol(job), in, out)
				defer s.Close()
				r := bufio.NewReader(s)
				for i := range 200 {
					if err := wire.WriteFrame(s, wire.MarshalStepRequest(wire.StepRequest{Step: int64(i)})); err != nil {
						t.Fatal(err)
					}
					if _, err := wire.ReadFrame(r, wire.MaxStepFrame); err != nil {
						t.Fatal(err)
					}
				}
			}},
			{"step 1.0.0, a stream a query", 1.6, func(in, out *int) {
				for i := range 50 {
					s := open(wire.StepProtocol(job), in, out)
					if err := wire.WriteFrame(s, wire.MarshalStepRequest(wire.StepRequest{Step: int64(i)})); err != nil {
						t.Fatal(err)
					}
					_ = s.CloseWrite()
					_, _ = io.Copy(io.Discard, s)
					_ = s.Close()
				}
			}},
			{"exchange, offers refused", 1, func(in, out *int) {
				for i := range 50 {
					s := open(wire.ExchangeProtocol(job), in, out)
					o := wire.Offer{Kind: 1, Encoding: wire.EncodingFloat32, Step: int64(i), ModelID: 1, N: 1, Block: wire.ExchangeBlock, Count: 1}
					if _, err := s.Write(wire.AppendOffer(nil, o)); err != nil {
						t.Fatal(err)
					}
					_ = s.CloseWrite()
					_, _ = io.Copy(io.Discard, s)
					_ = s.Close()
				}
			}},
			{"dht, FIND_NODE on one stream", 40, func(in, out *int) {
				s := open(protocol.ID("/psp/"+job+"/kad/1.0.0"), in, out)
				defer s.Close()
				r := bufio.NewReader(s)
				for i := range 50 {
					body, err := proto.Marshal(pb.NewMessage(pb.Message_FIND_NODE, []byte{byte(i)}, 0))
					if err != nil {
						t.Fatal(err)
					}
					if _, err := s.Write(append(binary.AppendUvarint(nil, uint64(len(body))), body...)); err != nil {
						t.Fatal(err)
					}
					n, err := binary.ReadUvarint(r)
					if err != nil {
						t.Fatal(err)
					}
					if _, err := io.CopyN(io.Discard, r, int64(n)); err != nil {
						t.Fatal(err)
					}
				}
			}},
		} {
			// (no t.Run inside a synctest bubble)
			var in, out int
			tc.attack(&in, &out)
			if in == 0 || out == 0 {
				t.Fatalf("%s: %d bytes sent, %d received: the protocol did not answer", tc.name, out, in)
			}
			if ratio := float64(in) / float64(out); ratio > tc.bound {
				t.Errorf("%s: %d bytes sent made the node send %d: %.2f×, want at most %.1f×", tc.name, out, in, ratio, tc.bound)
			} else {
				t.Logf("%s: %d bytes sent, %d received: %.2f×", tc.name, out, in, ratio)
			}
		}
		cancel() // the nodes stop training; their hosts still answer
		wait()
		{ // the DHT, asked as fast as the link goes: answered at its rate
			var in, out int
			s := open(wire.DHTProtocol(job), &in, &out)
			body, err := proto.Marshal(pb.NewMessage(pb.Message_FIND_NODE, []byte{1}, 0))
			if err != nil {
				t.Fatal(err)
			}
			frame := append(binary.AppendUvarint(nil, uint64(len(body))), body...)
			const requests = 1500
			_ = s.SetDeadline(time.Now().Add(time.Minute))
			start := time.Now()
			done := make(chan error, 1)
			go func() {
				for range requests {
					if _, err := s.Write(frame); err != nil {
						done <- err
						return
					}
				}
				done <- nil
			}()
			r := bufio.NewReader(s)
			answers := 0
			for range requests {
				n, err := binary.ReadUvarint(r)
				if err == nil {
					_, err = io.CopyN(io.Discard, r, int64(n))
				}
				if err != nil {
					break
				}
				answers++
			}
			elapsed := time.Since(start)
			_ = s.Reset()
			<-done
			rt := wire.DHTAnswerRate
			if limit := float64(rt.PeerBurst) + float64(rt.PerPeer)*elapsed.Seconds() + 4096; float64(in) > limit {
				t.Errorf("dht flood: %d answers, %d bytes in %v, want at most %.0f (a burst and %v B/s)", answers, in, elapsed, limit, rt.PerPeer)
			} else {
				t.Logf("dht flood: %d answers, %d bytes in %v (%.0f B/s)", answers, in, elapsed, float64(in)/elapsed.Seconds())
			}
		}
		{ // the model, asked again and again
			n := victim.Model().NumParams()
			shape := wire.ModelShape{ID: victim.Model().ModelID(), N: n}
			dst := make([]float32, n)
			served := 0
			for range 3 * wire.ModelPeerBudget {
				if _, _, err := wire.FetchBlocks(t.Context(), h, victim.ID(), job, shape, 0, wire.Blocks(n), dst, 1e9, 10*time.Second); err == nil {
					served++
				}
			}
			// A model this small counts as 1 MiB of the budget: every
			// request is served, each answer a head and the model.
			if served != 3*wire.ModelPeerBudget {
				t.Errorf("model: %d of %d requests for a model of %d values served", served, 3*wire.ModelPeerBudget, n)
			}
		}
	})
}
