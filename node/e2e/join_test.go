package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// The join's error is one line in /status, the log and /health: go-libp2p
// lists each address dialled on a line of its own.
func TestJoinErrorOneLine(t *testing.T) {
	dead := fmt.Sprintf("/ip4/127.0.0.1/tcp/%d/p2p/%s", freePort(t), testPeerID(t))
	cfg := tcpConfig()
	cfg.Bootstrap = []string{dead}
	nd := startNode(t, cfg)
	if !waitFor(10*time.Second, func() bool { return nd.Status().JoinAttempts >= 2 }) {
		t.Fatalf("no retry: %+v", nd.Status().JoinStatus)
	}
	st := nd.Status()
	if st.JoinError == "" || strings.ContainsAny(st.JoinError, "\r\n") {
		t.Errorf("join error %q: want one line", st.JoinError)
	}
	code, body := health(nd)
	if code != http.StatusServiceUnavailable || strings.Count(strings.TrimSuffix(body, "\n"), "\n") != 0 {
		t.Errorf("/health: %d %q, want 503 on one line", code, body)
	}
}

// A node without a swarm key that tries to join a private job is told
// that a key may be missing; one with another key, that the keys may
// differ.
func TestJoinHintsSwarmKey(t *testing.T) {
	cfg := tcpConfig()
	cfg.PSK = newKey(t)
	boot := startNode(t, cfg)
	other := newKey(t)
	other[0] ^= 1
	for _, tc := range []struct {
		name string
		key  []byte
		want string
	}{{"no key", nil, "is --swarm-key missing?"}, {"another key", other, "same swarm key"}} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tcpConfig()
			cfg.PSK, cfg.Bootstrap = tc.key, []string{addrOf(boot)}
			out := startNode(t, cfg)
			if !waitFor(10*time.Second, func() bool { return strings.Contains(out.Status().JoinError, tc.want) }) {
				t.Errorf("join error %q: want a hint %q", out.Status().JoinError, tc.want)
			}
		})
	}
	// A node that fails to reach an open job's dead address gets no hint.
	cfg = tcpConfig()
	cfg.Bootstrap = []string{fmt.Sprintf("/ip4/127.0.0.1/tcp/%d/p2p/%s", freePort(t), testPeerID(t))}
	nd := startNode(t, cfg)
	if st := nd.Status(); strings.Contains(st.JoinError, "swarm") {
		t.Errorf("a refused dial hints at a swarm key: %q", st.JoinError)
	}
}
