package e2e

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	manet "github.com/multiformats/go-multiaddr/net"

	"github.com/pspnode/pspnode/node"
	"github.com/pspnode/pspnode/node/netsetup"
)

// lineCounter is a slog handler that counts records at Warn and above
// whose message contains match.
type lineCounter struct {
	match string
	mu    sync.Mutex
	n     int
	msgs  []string
}

func (c *lineCounter) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (c *lineCounter) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, c.match) {
		c.mu.Lock()
		c.n++
		if len(c.msgs) < 20 {
			c.msgs = append(c.msgs, r.Message)
		}
		c.mu.Unlock()
	}
	return nil
}
func (c *lineCounter) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *lineCounter) WithGroup(string) slog.Handler      { return c }

func (c *lineCounter) lines() (int, []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n, append([]string(nil), c.msgs...)
}

// 2 000 junk connections to a private job's node (a TCP connection, a few
// bytes that are no handshake, then closed) are each counted, and logged
// in a few warnings and a summary line per interval with their count, not
// one warning each: the job's log is not flooded. Before, each wrote a
// warning line (108 000 in 10 s wrote 73 377 lines, 14 MB).
func TestRefusedHandshakesRateLimited(t *testing.T) {
	lc := &lineCounter{match: "refused"}
	cfg := tcpConfig()
	cfg.PSK = newKey(t)
	nd := startNode(t, cfg, node.WithLogger(slog.New(lc)))
	addr, err := manet.ToNetAddr(nd.Host().Addrs()[0])
	if err != nil {
		t.Fatal(err)
	}
	const junk = 2000
	start := time.Now()
	var wg sync.WaitGroup
	work := make(chan struct{})
	for range 16 {
		wg.Go(func() {
			for range work {
				c, err := net.DialTimeout("tcp", addr.String(), 5*time.Second)
				if err != nil {
					continue
				}
				_, _ = c.Write([]byte("GET / HTTP/1.1\r\nHost: pspnode\r\n\r\n"))
				_ = c.Close()
			}
		})
	}
	for range junk {
		work <- struct{}{}
	}
	close(work)
	wg.Wait()
	if !waitFor(30*time.Second, func() bool { return refused(t, nd.Registry(), "handshake") >= junk*9/10 }) {
		t.Fatalf("%v of %d junk connections counted as refused", refused(t, nd.Registry(), "handshake"), junk)
	}
	elapsed := time.Since(start)
	n, msgs := lc.lines()
	// Each interval begun: at most the burst of warnings and one summary.
	intervals := int(elapsed/netsetup.RefusedLogEvery) + 2
	if limit := intervals * (netsetup.RefusedLogBurst + 1); n > limit {
		t.Errorf("%d warning lines for %d refused connections in %v: want at most %d", n, junk, elapsed.Round(time.Millisecond), limit)
	}
	if n == 0 {
		t.Error("no refused connection was logged")
	}
	t.Logf("%d lines in %v: %q", n, elapsed.Round(time.Millisecond), msgs)
}
