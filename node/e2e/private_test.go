package e2e

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/pnet"
)

// A node with another swarm key, or none, cannot connect to a private
// job: the handshake fails, both sides count and log it, and the outsider
// learns no peer of the job. A node with the key joins.
func TestSwarmKeyRefusesOutsiders(t *testing.T) {
	key := newKey(t)
	other := newKey(t)
	other[0] ^= 1
	cfg := tcpConfig()
	cfg.PSK = key
	boot := startNode(t, cfg)

	for _, tc := range []struct {
		name string
		key  pnet.PSK
	}{{"another key", other}, {"no key", nil}} {
		t.Run(tc.name, func(t *testing.T) {
			before := refused(t, boot.Registry(), "handshake")
			cfg := tcpConfig()
			cfg.PSK, cfg.Bootstrap = tc.key, []string{addrOf(boot)}
			out := startNode(t, cfg)
			if st := out.Status(); st.Joined || st.JoinError == "" {
				t.Errorf("outsider joined %v, join error %q: want not joined, with a reason", st.Joined, st.JoinError)
			}
			// A dial may give up before its upgrade does: wait for the count.
			if !waitFor(10*time.Second, func() bool { return refused(t, out.Registry(), "handshake") >= 1 }) {
				t.Error("the outsider did not count the refused handshake")
			}
			if !waitFor(10*time.Second, func() bool { return refused(t, boot.Registry(), "handshake") > before }) {
				t.Error("the private node did not count the refused handshake")
			}
			if p := out.Overlay().Peers(); len(p) != 0 {
				t.Errorf("the outsider learned peers %v", p)
			}
			if slices.Contains(boot.Overlay().Peers(), out.ID()) {
				t.Error("the private node holds the outsider as a member")
			}
		})
	}

	cfg = tcpConfig()
	cfg.PSK, cfg.Bootstrap = key, []string{addrOf(boot)}
	in := startNode(t, cfg)
	if !waitFor(10*time.Second, func() bool { return in.Status().Joined && len(in.Overlay().Peers()) > 0 }) {
		t.Fatalf("a node with the key did not join: %+v", in.Status().JoinStatus)
	}
	for _, a := range in.Status().Addrs {
		if !strings.Contains(a, "/tcp/") {
			t.Errorf("a private node listens on %s", a)
		}
	}
}

// An allowlist refuses a stranger at the security handshake (counted as
// not_allowed) and admits a listed peer.
func TestAllowPeersRefusesStranger(t *testing.T) {
	friendKey, err := newIdentity()
	if err != nil {
		t.Fatal(err)
	}
	friend, _ := peerIDOf(friendKey)
	cfg := tcpConfig()
	cfg.AllowPeers = []peer.ID{friend}
	boot := startNode(t, cfg)

	cfg = tcpConfig()
	cfg.Bootstrap = []string{addrOf(boot)}
	stranger := startNode(t, cfg)
	if stranger.Status().Joined {
		t.Error("the stranger joined")
	}
	if !waitFor(10*time.Second, func() bool { return refused(t, boot.Registry(), "not_allowed") >= 1 }) {
		t.Error("the refusal of the stranger was not counted")
	}
	if slices.Contains(boot.Overlay().Peers(), stranger.ID()) {
		t.Error("the stranger is a member")
	}

	cfg = tcpConfig()
	cfg.Identity, cfg.Bootstrap = friendKey, []string{addrOf(boot)}
	f := startNode(t, cfg)
	if !waitFor(10*time.Second, func() bool { return f.Status().Joined && slices.Contains(boot.Overlay().Peers(), friend) }) {
		t.Fatalf("the listed peer did not join: %+v", f.Status().JoinStatus)
	}
}

// A node started before its bootstrap node keeps trying, says why it has
// not joined, and joins once the bootstrap node is up. Its bootstrap
// address is a DNS name (/dns4/localhost), after a dead first address.
func TestJoinWhenBootstrapStartsLater(t *testing.T) {
	bootKey, err := newIdentity()
	if err != nil {
		t.Fatal(err)
	}
	bootID, _ := peerIDOf(bootKey)
	port := freePort(t)
	dead := fmt.Sprintf("/ip4/127.0.0.1/tcp/%d/p2p/%s", freePort(t), testPeerID(t))

	cfg := tcpConfig()
	cfg.Bootstrap = []string{dead, fmt.Sprintf("/dns4/localhost/tcp/%d/p2p/%s", port, bootID)}
	early := startNode(t, cfg)
	st := early.Status()
	if st.Joined || !strings.Contains(st.JoinError, "bootstrap peer") || st.JoinAttempts < 1 || st.LastJoinAttempt == "" {
		t.Fatalf("before the bootstrap node is up: %+v", st.JoinStatus)
	}
	if code, body := health(early); code != http.StatusServiceUnavailable || !strings.Contains(body, "not joined") {
		t.Errorf("/health before joining: %d %q", code, body)
	}
	if !waitFor(10*time.Second, func() bool { return early.Status().JoinAttempts >= 3 }) {
		t.Fatalf("the node did not retry: %+v", early.Status().JoinStatus)
	}

	cfg = tcpConfig()
	cfg.Identity, cfg.Listen = bootKey, []string{fmt.Sprintf("/ip4/127.0.0.1/tcp/%d", port)}
	boot := startNode(t, cfg)
	if !waitFor(20*time.Second, func() bool {
		return early.Status().Joined && slices.Contains(early.Overlay().Peers(), boot.ID())
	}) {
		t.Fatalf("the node did not join once its bootstrap node was up: %+v", early.Status().JoinStatus)
	}
	if !waitFor(10*time.Second, func() bool { return slices.Contains(boot.Overlay().Peers(), early.ID()) }) {
		t.Error("the bootstrap node does not know the early node")
	}
	if code, _ := health(early); code != http.StatusOK {
		t.Errorf("/health once joined: %d", code)
	}
}

// A dead first bootstrap address does not hold up the join through a
// live second one.
func TestJoinDeadFirstBootstrap(t *testing.T) {
	boot := startNode(t, tcpConfig())
	dead := fmt.Sprintf("/ip4/127.0.0.1/tcp/%d/p2p/%s", freePort(t), testPeerID(t))
	cfg := tcpConfig()
	cfg.Bootstrap = []string{dead, addrOf(boot)}
	start := time.Now()
	nd := startNode(t, cfg)
	if !waitFor(10*time.Second, func() bool { return nd.Status().Joined }) {
		t.Fatalf("not joined with a live second bootstrap: %+v", nd.Status().JoinStatus)
	}
	t.Logf("joined %v after New began, with a dead first bootstrap address", time.Since(start).Round(time.Millisecond))
}
