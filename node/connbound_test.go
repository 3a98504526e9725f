package node

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/pspnode/pspnode/internal/memnet"
	"github.com/pspnode/pspnode/internal/vclock"
)

// TestConnectionsStayBounded runs 24 nodes under pBSP(3), each with a high
// watermark of 18 connections, until every node has checked its barrier
// many times (each check asks 3 peers drawn from all 23, dialling the ones
// it holds no connection to), then stops training and checks that within
// a trim period every node holds at most 18 connections, the protected
// ones (pool, the pools that hold it, zone: about 13) among them. The hosts' own
// connection managers (watermarks 10/20, a 20-s grace period) do not
// trim a connection younger than 20 s, nor count protected ones, so
// without the node's trimming each held almost everyone.
func TestConnectionsStayBounded(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		mn := memnet.New(0)
		t.Cleanup(func() { _ = mn.Close() })
		const n, low, high = 24, 12, 18
		nodes := buildTestNodesWith(t, n, "pbsp:3", 0.01, memHosts(t, mn), func(c *nodeSetup) {
			c.ConnLow, c.ConnHigh = low, high
			// A pool of 3 each way and, with buckets of 4, a zone of
			// several peers: what is protected fits under 18. No model,
			// so no gossip mesh.
			c.Overlay.PoolSize, c.Overlay.BucketSize = 3, 4
			c.opts = append(c.opts, WithTask(NewSleepTask(TimeModel{Scale: 0.01, Factor: 1}, c.Seed)))
		})
		ctx, cancel := context.WithCancel(t.Context())
		wait := runAll(t, ctx, nodes)
		trained := waitFor(60*time.Second, func() bool { return minStep(nodes) >= 20 })
		cancel()
		wait()
		if !trained {
			t.Fatalf("nodes did not train: lowest step %d", minStep(nodes))
		}
		var dials, trimmed uint64
		for _, nd := range nodes {
			st := nd.Status()
			dials += st.StepDials
			trimmed += st.ConnectionsTrimmed
		}
		// Every connection is now older than connMinAge, and the trimmer
		// has run since.
		time.Sleep(connMinAge + 2*connTrimEvery)
		synctest.Wait()
		for _, nd := range nodes {
			conns := nd.Host().Network().Conns()
			cm := nd.Host().ConnManager()
			protected := 0
			for _, p := range nd.Host().Network().Peers() {
				if cm.IsProtected(p, "") {
					protected++
				}
			}
			if len(conns) > high {
				t.Errorf("node %s holds %d connections (%d peers, %d protected, in-degree %d), more than the high watermark %d", nd.ID().ShortString(), len(conns), len(nd.Host().Network().Peers()), protected, nd.Status().PoolInDegree, high)
			}
			if protected < 3 {
				t.Errorf("node %s holds %d protected connections, fewer than its pool", nd.ID().ShortString(), protected)
			}
		}
		if trimmed == 0 || dials == 0 {
			t.Errorf("%d connections trimmed, %d step dials: the bound was never exercised", trimmed, dials)
		}
	})
}
