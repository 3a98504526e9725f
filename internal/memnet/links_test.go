package memnet

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/pspnode/pspnode/internal/vclock"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
)

// Each link draws its latency once from the configured range, the same in
// both directions, and the draws spread over the range.
func TestLatencyRange(t *testing.T) {
	n := NewNet(Config{LatencyMin: 10 * time.Millisecond, LatencyMax: 80 * time.Millisecond, Seed: 3})
	defer n.Close()
	var hosts []*Host
	for range 20 {
		h, err := n.NewHost(4, 8)
		if err != nil {
			t.Fatal(err)
		}
		hosts = append(hosts, h)
	}
	lo, hi := time.Hour, time.Duration(0)
	for i, a := range hosts {
		for _, b := range hosts[i+1:] {
			d := n.Latency(a.ID(), b.ID())
			if d != n.Latency(b.ID(), a.ID()) {
				t.Fatalf("latency %v→%v differs by direction", a.ID(), b.ID())
			}
			if d < 10*time.Millisecond || d >= 80*time.Millisecond {
				t.Fatalf("latency %v outside [10ms, 80ms)", d)
			}
			lo, hi = min(lo, d), max(hi, d)
		}
	}
	// 190 uniform draws: the extremes fall within a few ms of the bounds.
	if lo > 15*time.Millisecond || hi < 75*time.Millisecond {
		t.Errorf("190 link latencies span only [%v, %v] of [10ms, 80ms)", lo, hi)
	}
}

// The same seed gives the same peer IDs in the same order; another seed
// (or none) gives others.
func TestSeededKeys(t *testing.T) {
	ids := func(seed uint64) []peer.ID {
		n := NewNet(Config{Seed: seed})
		defer n.Close()
		var out []peer.ID
		for range 3 {
			h, err := n.NewHost(4, 8)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, h.ID())
		}
		return out
	}
	a, b, c, d := ids(7), ids(7), ids(8), ids(0)
	for i := range a {
		if a[i] != b[i] {
			t.Errorf("host %d: seed 7 gave %v then %v", i, a[i], b[i])
		}
		if a[i] == c[i] || a[i] == d[i] {
			t.Errorf("host %d: seeds 7, 8 and 0 gave the same ID %v", i, a[i])
		}
	}
}

// On the virtual clock a write takes its size over the bandwidth, and two
// writers into one host share its downlink. Every byte counts, libp2p's
// own too (identify, protocol negotiation): those few hundred take well
// under the slack of a millisecond allowed here.
func TestBandwidth(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		const rate = 1 << 20 // 1 MiB/s
		n := NewNet(Config{Bandwidth: rate, Seed: 1})
		defer n.Close()
		dst, err := n.NewHost(4, 8)
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan time.Duration, 2)
		dst.SetStreamHandler("/sink", func(s network.Stream) {
			t0 := time.Now()
			_, _ = io.Copy(io.Discard, s)
			_ = s.Close()
			got <- time.Since(t0)
		})
		ctx := context.Background()
		send := func(size int) {
			src, err := n.NewHost(4, 8)
			if err != nil {
				t.Error(err)
				return
			}
			s, err := src.NewStream(ctx, dst.ID(), "/sink")
			if err != nil {
				t.Error(err)
				return
			}
			if _, err := s.Write(make([]byte, size)); err != nil {
				t.Error(err)
			}
			_ = s.Close()
		}
		start := time.Now()
		send(rate / 2) // half a second alone
		const slack = time.Millisecond
		if d := time.Since(start); d < 500*time.Millisecond || d > 500*time.Millisecond+slack {
			t.Errorf("512 KiB at 1 MiB/s took %v of virtual time, want 500ms", d)
		}
		<-got
		start = time.Now()
		done := make(chan struct{})
		go func() { send(rate / 2); close(done) }()
		send(rate / 2)
		<-done
		// Both share dst's downlink: the second finishes after a second.
		if d := time.Since(start); d < time.Second || d > time.Second+slack {
			t.Errorf("two 512 KiB writes into one host took %v, want 1s", d)
		}
		<-got
		<-got
	})
}
