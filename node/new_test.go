package node

import (
	"context"
	"testing"
	"testing/synctest"
)

// A New that fails while building its host leaves nothing running: the
// connection manager's and resource manager's goroutines are stopped. In
// the bubble a leaked goroutine fails the test when the function returns.
func TestNewHostFailureLeaksNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := DefaultConfig()
		cfg.Job = "leak"
		cfg.Listen = []string{"/ip4/127.0.0.1/tcp/not-a-port"} // libp2p.New refuses it
		nd, err := New(context.Background(), cfg)
		if err == nil {
			nd.Close()
			t.Fatal("New accepted an unparsable listen address")
		}
	})
}
