package overlay

import (
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// TestPartitionHeals cuts 12 in-memory nodes into two halves until each
// side holds peers of the other as dead, heals the cut, and checks that
// the overlays merge again: revival probes dial the dead peers, and every
// node comes to know (almost) everyone.
func TestPartitionHeals(t *testing.T) { bubble(t, testPartitionHeals) }

func testPartitionHeals(t *testing.T) {
	const n = 12
	net, nodes := memOverlays(t, n, "partition", 20, 40, func(_ int, cfg *Config) {
		cfg.RetryDead = time.Second
		cfg.DeadHold = 30 * time.Second
	})
	side := map[peer.ID]int{}
	for i, o := range nodes {
		side[o.h.ID()] = i % 2
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
