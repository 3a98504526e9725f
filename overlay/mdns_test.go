package overlay

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
)

// Two nodes of a job started with mDNS and no address find each other on
// the local network: the second hears the first while it waits in New.
func TestMDNSFindsTheJob(t *testing.T) {
	job := fmt.Sprintf("mdns-%x", rand.Uint64()) // not another test run's job on this network
	var os []*Overlay
	var hs []host.Host
	for range 2 {
		h := tcpHost(t, nil)
		cfg := DefaultConfig()
		cfg.Job, cfg.KeepJoining, cfg.MDNS, cfg.MDNSWait = job, true, MDNSService(job, nil), time.Second
		o, err := New(context.Background(), h, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = o.Close() })
		os, hs = append(os, o), append(hs, h)
	}
	eventually(t, 30*time.Second, "the two nodes found by mDNS know each other", func() bool { return knowEachOther(os, hs) })
}

// mDNS is off unless asked for, and a job's service name names neither
// the job nor, for a private job, anything but its key.
func TestMDNSService(t *testing.T) {
	if DefaultConfig().MDNS != "" {
		t.Fatalf("mDNS on by default (%q): it announces the node to the whole network", DefaultConfig().MDNS)
	}
	k1, k2 := swarmKey(t), swarmKey(t)
	names := map[string]string{
		"job a":             MDNSService("a", nil),
		"job b":             MDNSService("b", nil),
		"job a, key 1":      MDNSService("a", k1),
		"job b, key 1":      MDNSService("b", k1),
		"job a, key 2":      MDNSService("a", k2),
		"mnist, no key":     MDNSService("mnist", nil),
		"a long job name !": MDNSService(strings.Repeat("x", 200), nil),
	}
	if names["job a, key 1"] != names["job b, key 1"] {
		t.Error("a private job's service name depends on its name, which it should not announce")
	}
	seen := map[string]string{}
	for what, s := range names {
		label := strings.TrimSuffix(s, "._udp")
		if len(label) > 15 || !strings.HasPrefix(label, "_psp-") || strings.Contains(s, "mnist") {
			t.Errorf("%s: service %q: want _psp-<8 hex>._udp (DNS-SD's 15-byte label), naming no job", what, s)
		}
		if other, ok := seen[s]; ok && what != "job b, key 1" && other != "job b, key 1" {
			t.Errorf("%s and %s share the service %q", what, other, s)
		}
		seen[s] = what
	}
}
