package main

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/host"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/pspnode/pspnode/node"
)

// libp2pHost starts a real go-libp2p host on addrs (with its SO_REUSEPORT
// TCP listener, as a running pspnode has) and returns it with the port of
// its first TCP or UDP listen address.
func libp2pHost(t *testing.T, addrs ...string) (host.Host, int) {
	t.Helper()
	h, err := libp2p.New(libp2p.ListenAddrStrings(addrs...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	// The first address with a port (go-libp2p adds /p2p-circuit).
	for _, a := range h.Network().ListenAddresses() {
		for _, code := range []int{ma.P_TCP, ma.P_UDP} {
			if v, err := a.ValueForProtocol(code); err == nil {
				p, err := strconv.Atoi(v)
				if err != nil {
					t.Fatal(err)
				}
				return h, p
			}
		}
	}
	t.Fatalf("the host listens on no port: %v", h.Network().ListenAddresses())
	return nil, 0
}

// Every bad flag, spec, address or file of `pspnode run` exits 2 with a
// message naming the flag (docs/cli.md), before the node prints its
// addresses, and without the help page. Each run is bounded by
// --duration: a build that let one through would start a node, run it
// for a second, exit 0 and fail here.
func TestRunUsageErrorsNameTheFlag(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.key")
	corrupt := filepath.Join(dir, "corrupt.key")
	notDir := filepath.Join(dir, "file")
	for _, f := range []struct{ path, body string }{{empty, ""}, {corrupt, "not a key\n"}, {notDir, "x"}} {
		if err := os.WriteFile(f.path, []byte(f.body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// A real pspnode-like holder of TCP and QUIC ports: a go-libp2p host.
	_, tcpPort := libp2pHost(t, "/ip4/127.0.0.1/tcp/0")
	_, udpPort := libp2pHost(t, "/ip4/127.0.0.1/udp/0/quic-v1")
	httpLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer httpLn.Close()
	busySock := filepath.Join(dir, "busy.sock")
	sockLn, err := net.Listen("unix", busySock)
	if err != nil {
		t.Fatal(err)
	}
	defer sockLn.Close()

	local := []string{"--listen", "/ip4/127.0.0.1/tcp/0", "--duration", "1s", "--log-level", "warn"}
	for _, tc := range []struct {
		name string
		args []string
		want []string // each in stderr
		not  []string // none in stderr
	}{
		{"mlp width 0", []string{"--model", "mlp:0"}, []string{`--model "mlp:0"`, "whole number >= 1"}, nil},
		{"unknown model", []string{"--model", "cnn"}, []string{`--model "cnn"`, "none, linreg, logreg, mlp or mlp:H"}, nil},
		{"unknown data", []string{"--data", "/does/not/exist"}, []string{`--data "/does/not/exist"`, "synthetic", "mnist:DIR"},
			[]string{"synthetic:regression", "synthetic:classification"}},
		{"missing mnist dir", []string{"--model", "logreg", "--data", "mnist:" + filepath.Join(dir, "none")}, []string{"--data mnist:"}, nil},
		{"model and data do not fit", []string{"--model", "linreg", "--data", "mnist"}, []string{"--model linreg does not fit --data"}, nil},
		{"listen garbage", []string{"--listen", "garbage"}, []string{`--listen "garbage"`}, nil},
		{"listen without transport", []string{"--listen", "/ip4/127.0.0.1/udp/0"}, []string{`--listen "/ip4/127.0.0.1/udp/0"`, "quic-v1"}, nil},
		{"empty identity", []string{"--identity", empty}, []string{"--identity " + empty, "empty"}, nil},
		{"corrupt identity", []string{"--identity", corrupt}, []string{"--identity " + corrupt, "not a libp2p private key"}, nil},
		{"bad barrier", []string{"--barrier", "xyz"}, []string{"-barrier", `unknown barrier "xyz"`, "pspnode run --help"},
			[]string{"USAGE", "DESCRIPTION", "-max-steps"}},
		{"empty bootstrap", []string{"--bootstrap", ""}, []string{"-bootstrap", "empty address"}, []string{"USAGE"}},
		{"empty bootstrap element", []string{"--bootstrap", "/ip4/127.0.0.1/tcp/1/p2p/12D3KooWJet9zUjcQVuuqdPsNE21jAXfaBd2i7ub7gBsRzz3rLch,"},
			[]string{"-bootstrap", "empty address"}, nil},
		{"checkpoint in a missing directory", []string{"--checkpoint", filepath.Join(dir, "none", "ck")}, []string{"--checkpoint", "no such file or directory"}, nil},
		{"checkpoint under a file", []string{"--checkpoint", filepath.Join(notDir, "ck")}, []string{"--checkpoint", "not a directory"}, nil},
		{"checkpoint is a directory", []string{"--checkpoint", dir}, []string{"--checkpoint " + dir + " is a directory"}, nil},
		{"TCP port of a running node", []string{"--listen", "/ip4/127.0.0.1/tcp/" + strconv.Itoa(tcpPort)},
			[]string{"--listen", "TCP port " + strconv.Itoa(tcpPort) + " on 127.0.0.1 is already in use"}, nil},
		{"TCP port of a running node, on all interfaces", []string{"--listen", "/ip4/0.0.0.0/tcp/" + strconv.Itoa(tcpPort)},
			[]string{"--listen", "TCP port " + strconv.Itoa(tcpPort) + " on 0.0.0.0 is already in use"}, nil},
		{"QUIC port of a running node", []string{"--listen", "/ip4/127.0.0.1/udp/" + strconv.Itoa(udpPort) + "/quic-v1"},
			[]string{"--listen", "UDP port " + strconv.Itoa(udpPort) + " on 127.0.0.1 is already in use"}, nil},
		{"busy http", []string{"--http", httpLn.Addr().String()}, []string{"--http " + httpLn.Addr().String(), "address already in use"}, nil},
		{"trainer socket of a running daemon", []string{"--trainer", "unix:" + busySock}, []string{"--trainer unix:" + busySock, "another daemon listens"}, nil},
		{"trainer socket in a missing directory", []string{"--trainer", "unix:" + filepath.Join(dir, "none", "t.sock")}, []string{"--trainer", "socket directory"}, nil},
		{"trainer on a public address", []string{"--trainer", "tcp:0.0.0.0:7000"}, []string{"--trainer", "loopback"}, nil},
		{"trainer address without a scheme", []string{"--trainer", "/tmp/t.sock"}, []string{"--trainer", "want unix:PATH"}, nil},
		{"trainer and a built-in model", []string{"--trainer", "unix:" + filepath.Join(dir, "t.sock"), "--model", "logreg"}, []string{"--trainer", "--model"}, nil},
		{"trainer flags without a trainer", []string{"--trainer-shm=false"}, []string{"--trainer-shm needs --trainer"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, append(append([]string{"run"}, local...), tc.args...)...)
			if code != 2 {
				t.Errorf("exit %d, want 2; stderr:\n%s", code, stderr)
			}
			if stdout != "" {
				t.Errorf("the node announced itself before failing:\n%s", stdout)
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr lacks %q:\n%s", w, stderr)
				}
			}
			for _, n := range tc.not {
				if strings.Contains(stderr, n) {
					t.Errorf("stderr holds %q:\n%s", n, stderr)
				}
			}
		})
	}
	// pspnode id reads --identity the same way.
	if code, _, stderr := runCLI(t, "id", "--identity", corrupt); code != 2 || !strings.Contains(stderr, "--identity "+corrupt) {
		t.Errorf("id with a corrupt key: exit %d, stderr %q", code, stderr)
	}
	// --help still prints the help page, and exits 0.
	if code, _, stderr := runCLI(t, "run", "--help"); code != 0 || !strings.Contains(stderr, "USAGE") || !strings.Contains(stderr, "-barrier") {
		t.Errorf("run --help: exit %d, stderr %q", code, stderr)
	}
}

// The default listen set (TCP and QUIC on IPv4 and IPv6) with a port a
// running node holds on IPv4 TCP: checkListen, which `pspnode run` calls
// with these addresses when --listen is not given, refuses to start,
// where go-libp2p would start on the other three and drop IPv4 TCP
// silently. (The default port itself, 4001, is not taken here: other
// programs on this machine may use it.)
func TestDefaultListenBusyPort(t *testing.T) {
	_, port := libp2pHost(t, "/ip4/0.0.0.0/tcp/0")
	var addrs []string
	for _, a := range node.DefaultConfig().Listen {
		addrs = append(addrs, strings.Replace(a, "/4001", "/"+strconv.Itoa(port), 1))
	}
	if len(addrs) != 4 || !strings.Contains(addrs[0], "/tcp/"+strconv.Itoa(port)) {
		t.Fatalf("the default listen set changed: %v", addrs)
	}
	_, err := checkListen(addrs, false)
	var u usageError
	if !errors.As(err, &u) || !strings.Contains(err.Error(), "--listen (default") ||
		!strings.Contains(err.Error(), "TCP port "+strconv.Itoa(port)+" on 0.0.0.0 is already in use") {
		t.Errorf("checkListen(default set on a taken port) = %v, want a usage error naming --listen and the port", err)
	}

	// An address this machine cannot bind at all (192.0.2.1 is a
	// documentation address, on no interface) is skipped in the default
	// set, as go-libp2p skips it (a machine without IPv6), but is an
	// error when asked for by --listen.
	free := "/ip4/127.0.0.1/tcp/0"
	absent := "/ip4/192.0.2.1/tcp/" + strconv.Itoa(port)
	want, err := checkListen([]string{free, absent}, false)
	if err != nil || len(want) != 1 || want[0].String() != free {
		t.Errorf("default set with an unbindable address: %v, %v; want only %s", want, err, free)
	}
	if _, err := checkListen([]string{free, absent}, true); err == nil || !strings.Contains(err.Error(), "--listen "+absent) {
		t.Errorf("--listen with an unbindable address: %v, want an error naming it", err)
	}
}
