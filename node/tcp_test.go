package node

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/pnet"
)

// tcpConfig is a node without a model on TCP loopback that retries its
// join quickly.
func tcpConfig() Config {
	cfg := DefaultConfig()
	cfg.Job = "jointest"
	cfg.Listen = []string{"/ip4/127.0.0.1/tcp/0"}
	cfg.Overlay.JoinTimeout = 2 * time.Second
	cfg.Overlay.Join.RetryMin, cfg.Overlay.Join.RetryMax, cfg.Overlay.Join.Check = 50*time.Millisecond, 400*time.Millisecond, 100*time.Millisecond
	return cfg
}

func startNode(t *testing.T, cfg Config, opts ...Option) *Node {
	t.Helper()
	nd, err := New(context.Background(), cfg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nd.Close() })
	return nd
}

func newKey(t *testing.T) pnet.PSK {
	t.Helper()
	return pnet.PSK(fmt.Appendf(nil, "%032d", time.Now().UnixNano()))
}

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
func health(nd *Node) (int, string) {
	rec := httptest.NewRecorder()
	nd.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/health", nil))
	return rec.Code, rec.Body.String()
}
