package e2e

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/internal/memnet"
	"github.com/pspnode/pspnode/internal/vclock"
	"github.com/pspnode/pspnode/node"
)

// A node with WithEvents says whom it meets, each step it takes, and who
// leaves; a full channel drops events, counted, and holds nothing up.
func TestEvents(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		events := make(chan node.Event, 4096)
		full := make(chan node.Event) // never read: every event is dropped
		mn := memnet.New(0)
		t.Cleanup(func() { _ = mn.Close() })
		nodes := memNodesWith(t, mn, 3, "pssp:2:1", 0.01, func(i int, _ *node.Config) []node.Option {
			switch i {
			case 0:
				return []node.Option{node.WithEvents(events)}
			case 1:
				return []node.Option{node.WithEvents(full)}
			}
			return nil
		})
		ctx, cancel := context.WithCancel(t.Context())
		wait := runAll(t, ctx, nodes[:2])
		defer func() { cancel(); wait() }()
		leaver := runOne(ctx, nodes[2])
		if !waitFor(20*time.Second, func() bool { return minStep(nodes) >= 10 }) {
			t.Fatal("the nodes did not train")
		}
		if err := nodes[2].Leave(time.Second); err != nil {
			t.Fatal(err)
		}
		<-leaver
		if !waitFor(10*time.Second, func() bool { return len(events) > 0 && hasEvent(events, node.PeerLeft, nodes[2].ID()) }) {
			t.Fatal("no peer-left event for the node that left")
		}
		cancel()
		wait()
		var met []peer.ID
		var steps int64
		for len(events) > 0 {
			ev := <-events
			switch ev.Kind {
			case node.PeerJoined:
				met = append(met, ev.Peer)
			case node.Stepped:
				steps++
				if ev.Step != steps {
					t.Errorf("stepped event %d says step %d", steps, ev.Step)
				}
			}
		}
		for _, nd := range nodes[1:] {
			if !slices.Contains(met, nd.ID()) {
				t.Errorf("no peer-joined event for %s", nd.ID().ShortString())
			}
		}
		if steps == 0 || steps != nodes[0].Step() {
			t.Errorf("%d stepped events, the node took %d steps", steps, nodes[0].Step())
		}
		if got := metric(t, nodes[1].Registry(), "psp_events_dropped_total", "", ""); got < float64(nodes[1].Step()) {
			t.Errorf("a full channel dropped %v events over %d steps", got, nodes[1].Step())
		}
	})
}

// hasEvent reports whether the channel holds an event of kind about p,
// putting back what it read.
func hasEvent(ch chan node.Event, kind node.EventKind, p peer.ID) bool {
	var seen []node.Event
	found := false
	for len(ch) > 0 {
		ev := <-ch
		seen = append(seen, ev)
		found = found || ev.Kind == kind && ev.Peer == p
	}
	for _, ev := range seen {
		ch <- ev
	}
	return found
}
