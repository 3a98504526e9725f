package daemontest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/pspnode/pspnode/internal/syncbuf"
)

// Daemon is a running `pspnode run` process.
type Daemon struct {
	Cmd    *exec.Cmd
	ID     string // peer ID
	Addr   string // first dialable multiaddr, ending in /p2p/ID
	HTTP   string // base URL of /status and /metrics
	Stderr *syncbuf.Buffer
	// Done receives the process's exit once; a test that waits on it
	// must send a value back for the cleanup, which waits too.
	Done chan error
}

// printTimeout bounds the wait for the daemon's addresses.
const printTimeout = 20 * time.Second

// Start runs `bin run args...` and waits until it has printed its
// addresses (it must be given --http). The process is killed when the
// test ends.
func Start(t testing.TB, bin string, args ...string) *Daemon {
	t.Helper()
	d := &Daemon{Stderr: &syncbuf.Buffer{}, Done: make(chan error, 1)}
	d.Cmd = exec.Command(bin, append([]string{"run"}, args...)...)
	d.Cmd.Stderr = d.Stderr
	out, err := d.Cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string)
	t.Cleanup(func() {
		_ = d.Cmd.Process.Kill()
		// Drain what the reader may still be sending (Start can fail
		// before it reads every line), so that it reaches Wait.
		go func() {
			for range lines {
			}
		}()
		<-d.Done
	})
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		_, _ = io.Copy(io.Discard, out)
		d.Done <- d.Cmd.Wait()
	}()
	timeout := time.After(printTimeout)
	for d.HTTP == "" {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("pspnode exited before printing its addresses; stderr:\n%s", d.Stderr)
			}
			switch {
			case strings.HasPrefix(l, "peer id: "):
				d.ID = strings.TrimPrefix(l, "peer id: ")
			case strings.HasPrefix(l, "listening: ") && d.Addr == "":
				d.Addr = strings.TrimPrefix(l, "listening: ")
			case strings.HasPrefix(l, "http: "):
				d.HTTP = strings.Fields(l)[1]
			}
		case <-timeout:
			t.Fatalf("pspnode printed no addresses in %s; stderr:\n%s", printTimeout, d.Stderr)
		}
	}
	go func() { // keep draining stdout until the process exits
		for range lines {
		}
	}()
	if d.ID == "" || !strings.HasSuffix(d.Addr, "/p2p/"+d.ID) {
		t.Fatalf("printed multiaddr %q does not end in /p2p/%s", d.Addr, d.ID)
	}
	return d
}

// GetJSON decodes the daemon's HTTP path (e.g. /status) into v, with a
// 2-second deadline.
func (d *Daemon) GetJSON(path string, v any) error {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(d.HTTP + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}
