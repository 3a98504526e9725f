package node

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/internal/memnet"
	"github.com/pspnode/pspnode/internal/vclock"
)

// memJoinNode starts a node without a model on host h, bootstrapping from
// boot, inside a bubble.
func memJoinNode(t *testing.T, h host.Host, boot ...*Node) *Node {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Job = "jointest"
	for _, b := range boot {
		cfg.Bootstrap = append(cfg.Bootstrap, b.Addrs()[0].String())
	}
	nd, err := New(context.Background(), cfg, WithHost(h))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nd.Close() })
	return nd
}

func knowsAll(nodes ...*Node) bool {
	for _, a := range nodes {
		peers := a.Overlay().Peers()
		for _, b := range nodes {
			if a != b && !slices.Contains(peers, b.ID()) {
				return false
			}
		}
	}
	return true
}

func groupOf(group1 ...peer.ID) func(peer.ID) int {
	return func(p peer.ID) int {
		if slices.Contains(group1, p) {
			return 1
		}
		return 0
	}
}

// A node whose only bootstrap peer is unreachable when it starts does not
// fail: it starts alone, says why it has not joined, retries with backoff,
// and joins once the bootstrap peer can be reached.
func TestJoinAfterBootstrapBecomesReachable(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		mn := memnet.New(0)
		t.Cleanup(func() { _ = mn.Close() })
		mk := memHosts(t, mn)
		hb := mk()
		mn.Partition(groupOf(hb.ID()))
		boot := memJoinNode(t, hb)
		nd := memJoinNode(t, mk(), boot)
		if st := nd.Status(); st.Joined || st.JoinError == "" || st.JoinAttempts != 1 {
			t.Fatalf("cut off from its bootstrap peer: %+v", st.JoinStatus)
		}
		time.Sleep(time.Minute)
		if st := nd.Status(); st.Joined || st.JoinAttempts < 4 {
			t.Fatalf("a minute later: %+v, want several attempts", st.JoinStatus)
		}
		mn.Heal()
		joined := func() bool {
			st := nd.Status()
			return st.Joined && st.JoinError == "" && st.JoinAttempts == 0 && knowsAll(boot, nd)
		}
		if !waitFor(2*time.Minute, joined) {
			t.Fatalf("not joined after the partition healed: %+v", nd.Status().JoinStatus)
		}
	})
}

// Two halves of a job, each joined through a different bootstrap peer,
// meet again: a node configured with both dials the one it does not know.
func TestSplitMergesThroughBootstrapPeers(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		mn := memnet.New(0)
		t.Cleanup(func() { _ = mn.Close() })
		mk := memHosts(t, mn)
		hb1, hb2, hx, hy := mk(), mk(), mk(), mk()
		mn.Partition(groupOf(hb1.ID(), hx.ID()))
		b1, b2 := memJoinNode(t, hb1), memJoinNode(t, hb2)
		x := memJoinNode(t, hx, b1, b2) // reaches b1 only
		y := memJoinNode(t, hy, b2)
		if !waitFor(time.Minute, func() bool { return knowsAll(b1, x) && knowsAll(b2, y) }) {
			t.Fatal("the halves did not form")
		}
		mn.Heal()
		if !waitFor(5*time.Minute, func() bool { return knowsAll(b1, b2, x, y) }) {
			t.Fatalf("the halves never met: x knows %v, y knows %v", x.Overlay().Peers(), y.Overlay().Peers())
		}
		if got := x.Status().BootstrapRediscovered; got != 1 {
			t.Errorf("x rediscovered %d bootstrap peers, want 1", got)
		}
	})
}
