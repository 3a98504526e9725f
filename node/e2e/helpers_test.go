package e2e

import (
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/pnet"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pspnode/pspnode/node"
)

// These tests build real hosts on TCP loopback (a swarm key and a gater
// need a host the node builds), so they run on real time and wait on
// conditions with deadlines.

// tcpConfig is a node without a model on TCP loopback that retries its
// join quickly.
func tcpConfig() node.Config {
	cfg := node.DefaultConfig()
	cfg.Job = "jointest"
	cfg.Listen = []string{"/ip4/127.0.0.1/tcp/0"}
	cfg.Overlay.JoinTimeout = 2 * time.Second
	cfg.Overlay.Join.RetryMin, cfg.Overlay.Join.RetryMax, cfg.Overlay.Join.Check = 50*time.Millisecond, 400*time.Millisecond, 100*time.Millisecond
	return cfg
}

func startNode(t *testing.T, cfg node.Config, opts ...node.Option) *node.Node {
	t.Helper()
	nd, err := node.New(context.Background(), cfg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nd.Close() })
	return nd
}

// refused reads psp_handshakes_refused_total{reason} from a node's registry.
func refused(t *testing.T, reg *prometheus.Registry, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "psp_handshakes_refused_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

func newKey(t *testing.T) pnet.PSK {
	t.Helper()
	return pnet.PSK(fmt.Appendf(nil, "%032d", time.Now().UnixNano()))
}

func addrOf(nd *node.Node) string { return nd.Addrs()[0].String() }

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// health gets a node's /health.
func health(nd *node.Node) (int, string) {
	rec := httptest.NewRecorder()
	nd.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/health", nil))
	return rec.Code, rec.Body.String()
}

// newIdentity makes a fresh Ed25519 key, as pspnode run does without
// --identity.
func newIdentity() (crypto.PrivKey, error) {
	k, _, err := crypto.GenerateEd25519Key(rand.Reader)
	return k, err
}

func peerIDOf(k crypto.PrivKey) (peer.ID, error) { return peer.IDFromPrivateKey(k) }

func testPeerID(t *testing.T) peer.ID {
	t.Helper()
	k, err := newIdentity()
	if err != nil {
		t.Fatal(err)
	}
	id, err := peerIDOf(k)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// waitFor polls cond every 20 ms until it holds or within passes; it
// reports whether cond held.
func waitFor(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}
