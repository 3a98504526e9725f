package node

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/internal/memnet"
	"github.com/pspnode/pspnode/internal/vclock"
	"github.com/pspnode/pspnode/node/status"
)

// A node with WithEvents says whom it meets, each step it takes, and who
// leaves; a full channel drops events, counted, and holds nothing up.
func TestEvents(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		mn := memnet.New(0)
		t.Cleanup(func() { _ = mn.Close() })
		events := make(chan Event, 4096)
		full := make(chan Event) // never read: every event is dropped
		i := 0
		nodes := buildTestNodesWith(t, 3, "pssp:2:1", 0.01, memHosts(t, mn), func(s *nodeSetup) {
			switch i {
			case 0:
				s.opts = append(s.opts, WithEvents(events))
			case 1:
				s.opts = append(s.opts, WithEvents(full))
			}
			i++
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
		if !waitFor(10*time.Second, func() bool { return len(events) > 0 && hasEvent(events, PeerLeft, nodes[2].ID()) }) {
			t.Fatal("no peer-left event for the node that left")
		}
		cancel()
		wait()
		var met []peer.ID
		var steps int64
		for len(events) > 0 {
			ev := <-events
			switch ev.Kind {
			case PeerJoined:
				met = append(met, ev.Peer)
			case Stepped:
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
		if got := status.CounterValue(nodes[1].m.EventsDropped); got < float64(nodes[1].Step()) {
			t.Errorf("a full channel dropped %v events over %d steps", got, nodes[1].Step())
		}
	})
}

// hasEvent reports whether the channel holds an event of kind about p,
// putting back what it read.
func hasEvent(ch chan Event, kind EventKind, p peer.ID) bool {
	var seen []Event
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
