package node

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// Join retries dial. A bootstrap address that accepts TCP connections and
// closes them at once fails every attempt; the joiner retries every 50 to
// 400 ms here, and each retry must reach the address. (go-libp2p's own
// dial backoff, 5 s after a failure and more after each next one, made
// most retries fail with "dial backoff" without dialling.)
func TestJoinRetriesDial(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var accepted atomic.Int64
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			_ = c.Close()
		}
	}()
	cfg := tcpConfig()
	cfg.Bootstrap = []string{fmt.Sprintf("/ip4/127.0.0.1/tcp/%d/p2p/%s", l.Addr().(*net.TCPAddr).Port, testPeerID(t))}
	nd := startNode(t, cfg)
	if !waitFor(5*time.Second, func() bool { return accepted.Load() >= 6 }) {
		t.Errorf("%d dials reached the bootstrap address in 5 s of retries every 50-400 ms (%d join attempts; last error %q)",
			accepted.Load(), nd.Status().JoinAttempts, nd.Status().JoinError)
	}
	if st := nd.Status(); strings.Contains(st.JoinError, "dial backoff") {
		t.Errorf("a retry failed on go-libp2p's dial backoff: %q", st.JoinError)
	}
}

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
