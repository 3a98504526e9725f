package overlay

import (
	"context"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/internal/memnet"
)

// TestPartitionHeals cuts 12 in-memory nodes into two halves until each
// side holds peers of the other as dead, heals the cut, and checks that
// the overlays merge again: revival probes dial the dead peers, and every
// node comes to know (almost) everyone.
func TestPartitionHeals(t *testing.T) {
	const n = 12
	net := memnet.New(0)
	t.Cleanup(func() { _ = net.Close() })
	var nodes []*Overlay
	side := map[peer.ID]int{}
	for i := range n {
		h, err := net.NewHost(20, 40)
		if err != nil {
			t.Fatal(err)
		}
		cfg := fastConfig("partition")
		cfg.RetryDead = time.Second
		cfg.DeadHold = 30 * time.Second
		if i > 0 {
			cfg.BootstrapPeers = []peer.AddrInfo{{ID: nodes[0].h.ID(), Addrs: nodes[0].h.Addrs()}}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		o, err := New(ctx, h, cfg)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = o.Close(); _ = h.Close() })
		nodes = append(nodes, o)
		side[h.ID()] = i % 2
	}
	knowsMost := func() bool {
		for _, o := range nodes {
			if len(o.Peers()) < n-2 {
				return false
			}
		}
		return true
	}
	eventually(t, 20*time.Second, "every node to know most others", knowsMost)

	net.Partition(func(p peer.ID) int { return side[p] })
	// Hold the cut until no routing table has a peer of the other side
	// left: then nothing but the dead-peer retries can bridge it.
	eventually(t, 40*time.Second, "routing tables to lose every peer across the cut", func() bool {
		for _, o := range nodes {
			for _, p := range o.dht.RoutingTable().ListPeers() {
				if side[p] != side[o.h.ID()] {
					return false
				}
			}
			if o.Status().Dead == 0 {
				return false
			}
		}
		return true
	})
	net.Heal()
	eventually(t, 30*time.Second, "the overlays to merge after healing", func() bool {
		for _, o := range nodes {
			if o.Status().Dead > 1 {
				return false
			}
		}
		return knowsMost()
	})
}
