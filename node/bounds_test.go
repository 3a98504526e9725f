package node

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/libp2p/go-libp2p/core/network"

	"github.com/pspnode/pspnode/internal/memnet"
	"github.com/pspnode/pspnode/internal/vclock"
)

// Slow model streams do not crowd out step queries. Two peers each hold
// eight model streams open on the first node, announcing a request and
// never sending it (a stream may rightly last 10 × QueryTimeout). With
// the step protocol's caps at 8 per peer and 16 in all, a shared limiter
// was full: every step query was refused and the askers took the node
// for dead. The model protocol has caps of its own.
func TestSlowModelStreamsLeaveStepQueries(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		mn := memnet.New(0)
		t.Cleanup(func() { _ = mn.Close() })
		nodes := buildTestNodesWith(t, 3, "asp", 0.01, memHosts(t, mn), func(c *Config) {
			c.MaxStreamsPerPeer, c.MaxInboundStreams = 8, 16
		})
		target := nodes[0]
		var held []network.Stream
		for _, nd := range nodes[1:] {
			for range 8 {
				s, err := nd.Host().NewStream(t.Context(), target.ID(), target.modelID)
				if err != nil {
					t.Fatal(err)
				}
				_, _ = s.Write([]byte{1}) // a frame of one byte is coming; it never does
				held = append(held, s)
			}
		}
		synctest.Wait() // the target's handlers hold every stream they took
		for _, nd := range nodes[1:] {
			if _, err := nd.queryStep(t.Context(), target.ID(), StepRequest{Step: 1}); err != nil {
				t.Errorf("%s's step query refused while slow model streams are open: %v", nd.ID().ShortString(), err)
			}
		}
		if got := target.Status().StreamsRefused; got == 0 {
			t.Error("no model stream over the model protocol's caps was refused")
		}
		for _, s := range held {
			_ = s.Reset()
		}
	})
}

// keep the imports used by later tests in this file
var _ = context.Background
var _ = time.Second
