package main

import (
	"net"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/pspnode/pspnode/internal/daemontest"
)

// A daemon waiting for its trainer stops on SIGTERM at once with exit code
// 0, as --help says: alone with idle connections on its trainer socket
// (connected, never a byte), and beside a peer it joined. Before, the
// idle connections held it up for 2 minutes (gRPC's wait for each
// connection's preface).
func TestTrainerDaemonSIGTERMExitsZero(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t)
	dir := t.TempDir()
	start := func(name, boot string) *daemontest.Daemon {
		args := []string{"--job", "sigterm", "--listen", "/ip4/127.0.0.1/tcp/0", "--http", "127.0.0.1:0",
			"--trainer", "unix:" + filepath.Join(dir, name+".sock")}
		if boot != "" {
			args = append(args, "--bootstrap", boot)
		}
		return daemontest.Start(t, bin, args...)
	}
	first := start("first", "")
	second := start("second", first.Addr)
	for range 100 {
		c, err := net.Dial("unix", filepath.Join(dir, "first.sock"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	for _, d := range []*daemontest.Daemon{second, first} {
		if err := d.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-d.Done:
			d.Done <- err
			if err != nil {
				t.Errorf("daemon %s exited with %v after SIGTERM, want 0; stderr:\n%s", d.ID, err, d.Stderr)
			}
		case <-time.After(15 * time.Second):
			t.Errorf("daemon %s did not exit within 15 s of SIGTERM", d.ID)
		}
	}
}
