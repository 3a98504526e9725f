package memnet

import (
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/internal/vclock"
)

// A host's connection manager leaves connections younger than its grace
// period (HostOptions.Grace, 20 s if unset) untrimmed, however far above
// its high watermark the host is, and trims older ones down to its low
// watermark.
func TestConnGrace(t *testing.T) {
	for _, tc := range []struct {
		name    string
		grace   time.Duration
		after   time.Duration
		trimmed bool
	}{
		{"default grace, 10 s in", 0, 10 * time.Second, false},
		{"default grace, 30 s in", 0, 30 * time.Second, true},
		{"2-s grace, 1 s in", 2 * time.Second, time.Second, false},
		{"2-s grace, 5 s in", 2 * time.Second, 5 * time.Second, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vclock.Test(t, func(t *testing.T) {
				n := New(0)
				defer n.Close()
				a, err := n.NewHostWith(HostOptions{Low: 1, High: 2, Grace: tc.grace})
				if err != nil {
					t.Fatal(err)
				}
				for range 4 {
					b, err := n.NewHost(4, 8)
					if err != nil {
						t.Fatal(err)
					}
					if err := a.Connect(t.Context(), peer.AddrInfo{ID: b.ID()}); err != nil {
						t.Fatal(err)
					}
				}
				time.Sleep(tc.after)
				a.ConnManager().TrimOpenConns(t.Context())
				held := len(a.Network().Conns())
				if trimmed := held == 1; trimmed != tc.trimmed {
					t.Errorf("%d of 4 connections held after %v with grace %v; want trimmed %v", held, tc.after, tc.grace, tc.trimmed)
				}
			})
		})
	}
}
