package main

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// TestMain lets a test run this test binary as the pspnode command
// (PSPNODE_TEST_MAIN=1, arguments as pspnode's), so that a test can read
// everything the process writes to its real stderr, go-libp2p's own logs
// included, without building the binary again. It removes the binary
// buildBinary built for the other process tests.
func TestMain(m *testing.M) {
	if os.Getenv("PSPNODE_TEST_MAIN") == "1" {
		probeListen = os.Getenv("PSPNODE_TEST_PROBE") != "0"
		main()
	}
	code := m.Run()
	if built.dir != "" {
		_ = os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// When a port is taken after the bind test (a race), the start itself
// catches it: go-libp2p's start fails, or starts on the other addresses
// only. Either way the message is pspnode's, without the three lines
// go-libp2p's fx logger writes in front of it ("OnStart hook failed",
// "start failed, rolling back", "start failed"). This runs the real
// process (the test binary as pspnode) to read its real stderr, with the
// bind test off.
func TestListenFailureAtStart(t *testing.T) {
	taken, err := net.Listen("tcp4", "127.0.0.1:0") // no SO_REUSEPORT: go-libp2p cannot share it
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	busy := "/ip4/127.0.0.1/tcp/" + strconv.Itoa(taken.Addr().(*net.TCPAddr).Port)
	for _, tc := range []struct {
		name   string
		listen string
		code   int
		want   string
	}{
		{"every address taken", busy, 1, "address already in use"},
		{"one address of two taken", busy + ",/ip4/127.0.0.1/tcp/0", 2, "--listen " + busy + ": the node could not listen there"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "run", "--listen", tc.listen, "--model", "none", "--duration", "1s", "--log-level", "warn")
			cmd.Env = append(os.Environ(), "PSPNODE_TEST_MAIN=1", "PSPNODE_TEST_PROBE=0", "GOLOG_LOG_LEVEL=")
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != tc.code {
				t.Errorf("exit %v, want %d; stderr:\n%s", err, tc.code, stderr.String())
			}
			if !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("stderr lacks %q:\n%s", tc.want, stderr.String())
			}
			for _, fx := range []string{"OnStart hook failed", "start failed", "system=fx"} {
				if strings.Contains(stderr.String(), fx) {
					t.Errorf("stderr holds go-libp2p's fx line %q:\n%s", fx, stderr.String())
				}
			}
			if strings.Contains(stdout.String(), "peer id:") {
				t.Errorf("the node announced itself:\n%s", stdout.String())
			}
		})
	}
}

// go-libp2p's loggers keep their levels and other records: only fx's
// error records, which repeat the error libp2p.New returns, are dropped.
// The loggers are built as gologshim builds them: the default handler
// with logger=NAME, then fx's With("system", "fx").
func TestLibp2pLogHandler(t *testing.T) {
	var buf bytes.Buffer
	h := newLibp2pHandler(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	h.level = slog.LevelError // what gologshim's environment default gives the handler
	config := slog.New(h).With("logger", "p2p-config")
	fx := config.With("system", "fx")
	ctx := context.Background()

	fx.ErrorContext(ctx, "start failed")
	config.With("logger", "other").ErrorContext(ctx, "PSK forced")
	config.WarnContext(ctx, "below the level")
	fx.DebugContext(ctx, "provided")
	out := buf.String()
	if strings.Contains(out, "start failed") {
		t.Errorf("fx's error record was written: %q", out)
	}
	if !strings.Contains(out, "PSK forced") || !strings.Contains(out, "logger=p2p-config") {
		t.Errorf("another p2p-config error was dropped: %q", out)
	}
	if strings.Contains(out, "below the level") || strings.Contains(out, "provided") {
		t.Errorf("records below the subsystem's level were written: %q", out)
	}
}
