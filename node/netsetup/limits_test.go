package netsetup

import (
	"testing"

	rcmgr "github.com/libp2p/go-libp2p/p2p/host/resource-manager"
)

// A built host's inbound limits are raised to at least minInboundConns
// where the file descriptors allow, never lowered, and the connection
// manager's watermarks stay at most a quarter of the inbound limit.
func TestRaiseConnLimits(t *testing.T) {
	for _, tc := range []struct {
		name        string
		memory      int64
		fds         int
		wantInbound int
	}{
		{"24 GiB, 20 000 descriptors", 3 << 30, 10000, minInboundConns},
		{"1 GiB, 1 024 descriptors", 1 << 30, 1024, 0}, // what the descriptors allow: go-libp2p's own
		{"64 GiB, 1 M descriptors", 8 << 30, 1 << 20, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			auto := rcmgr.DefaultLimits.Scale(tc.memory, tc.fds)
			before := auto.ToPartialLimitConfig()
			raised, cl := raiseConnLimits(auto, 64, 256)
			after := raised.ToPartialLimitConfig()
			if after.System.ConnsInbound < before.System.ConnsInbound || after.Transient.ConnsInbound < before.Transient.ConnsInbound {
				t.Errorf("limits lowered: system %v → %v, transient %v → %v", before.System.ConnsInbound, after.System.ConnsInbound,
					before.Transient.ConnsInbound, after.Transient.ConnsInbound)
			}
			if int(after.System.ConnsInbound) != cl.Inbound {
				t.Errorf("inbound limit %v, reported %d", after.System.ConnsInbound, cl.Inbound)
			}
			if tc.wantInbound > 0 && cl.Inbound != tc.wantInbound {
				t.Errorf("inbound limit %d, want %d", cl.Inbound, tc.wantInbound)
			}
			if cl.Inbound > max(int(before.System.ConnsInbound), int(before.System.FD)/2) {
				t.Errorf("inbound limit %d beyond what %v descriptors allow", cl.Inbound, before.System.FD)
			}
			if 4*cl.High > cl.Inbound || cl.Low > cl.High || cl.High <= 0 {
				t.Errorf("watermarks %d/%d for an inbound limit of %d", cl.Low, cl.High, cl.Inbound)
			}
			if int(after.Transient.ConnsInbound) < cl.Inbound/2 && int(after.Transient.ConnsInbound) < int(before.Transient.ConnsInbound) {
				t.Errorf("transient inbound %v for an inbound limit of %d", after.Transient.ConnsInbound, cl.Inbound)
			}
		})
	}
}
