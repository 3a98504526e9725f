package e2e

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/internal/memnet"
	"github.com/pspnode/pspnode/internal/vclock"
	"github.com/pspnode/pspnode/node"
	"github.com/pspnode/pspnode/node/netsetup"
)

// TestConnectionsStayBounded connects 12 peers to a node whose high
// watermark is 6 and low 4, two of them protected, and checks that within
// a trim period the node holds at most 6 connections (4, the low
// watermark), the protected ones among them. The host's own connection
// manager (watermarks 10/20, a 20-s grace period) trims nothing younger
// than 20 s, so without the node's trimming it held all 12.
func TestConnectionsStayBounded(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		const low, high = 4, 6
		mn := memnet.New(0)
		t.Cleanup(func() { _ = mn.Close() })
		nd := memNodesOn(t, mn, 1, "asp", 0.01, func(c *node.Config) {
			c.Limits.ConnLow, c.Limits.ConnHigh, c.Limits.BoundConns = low, high, true
		})[0]
		var peers []host.Host
		for range 12 {
			h, err := mn.NewHost(10, 20)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = h.Close() })
			if err := h.Connect(t.Context(), peer.AddrInfo{ID: nd.ID(), Addrs: nd.Addrs()}); err != nil {
				t.Fatal(err)
			}
			peers = append(peers, h)
		}
		cm := nd.Host().ConnManager()
		cm.Protect(peers[0].ID(), "test")
		cm.Protect(peers[1].ID(), "test")
		if got := len(nd.Host().Network().Conns()); got < 12 {
			t.Fatalf("node holds %d connections before trimming, want at least 12", got)
		}
		// Every connection is now past netsetup.ConnMinAge, and the trimmer has run
		// since (the bubble's clock: no real waiting).
		time.Sleep(netsetup.ConnMinAge + 2*netsetup.TrimEvery)
		synctest.Wait()
		if got := len(nd.Host().Network().Conns()); got > high {
			t.Errorf("node holds %d connections, more than the high watermark %d", got, high)
		}
		for _, p := range peers[:2] {
			if len(nd.Host().Network().ConnsToPeer(p.ID())) == 0 {
				t.Errorf("protected peer %s was trimmed", p.ID().ShortString())
			}
		}
		if nd.Status().ConnectionsTrimmed == 0 {
			t.Error("no connection counted as trimmed")
		}
	})
}
