package node

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/pnet"
)

func testPeerID(t *testing.T) peer.ID {
	t.Helper()
	k, err := NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	id, err := PeerIDOf(k)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func TestParseSwarmKey(t *testing.T) {
	hex64 := strings.Repeat("0123456789abcdef", 4)
	for _, tc := range []struct {
		name, in string
		ok       bool
	}{
		{"base16", "/key/swarm/psk/1.0.0/\n/base16/\n" + hex64 + "\n", true},
		{"crlf", "/key/swarm/psk/1.0.0/\r\n/base16/\r\n" + hex64, true},
		{"base64", "/key/swarm/psk/1.0.0/\n/base64/\n" + "ASNFZ4mrze8BI0VniavN7wEjRWeJq83vASNFZ4mrze8=", true},
		{"short", "/key/swarm/psk/1.0.0/\n/base16/\n" + hex64[:40], false},
		{"not hex", "/key/swarm/psk/1.0.0/\n/base16/\n" + strings.Repeat("zz", 32), false},
		{"no header", hex64, false},
		{"other encoding", "/key/swarm/psk/1.0.0/\n/base32/\n" + hex64, false},
		{"empty", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k, err := ParseSwarmKey([]byte(tc.in))
			if tc.ok != (err == nil) {
				t.Fatalf("ParseSwarmKey: err %v, want ok %v", err, tc.ok)
			}
			if tc.ok && len(k) != 32 {
				t.Errorf("key of %d bytes", len(k))
			}
		})
	}
}

// keygen writes a key kubo can read, with mode 0600, and never overwrites
// an existing file.
func TestWriteSwarmKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), "swarm.key")
	if err := WriteSwarmKey(path); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", fi.Mode().Perm())
	}
	b, _ := os.ReadFile(path)
	if !strings.HasPrefix(string(b), "/key/swarm/psk/1.0.0/\n/base16/\n") {
		t.Errorf("not in swarm.key format: %q", b)
	}
	k, err := pnet.DecodeV1PSK(bytes.NewReader(b))
	if err != nil || len(k) != 32 {
		t.Fatalf("go-libp2p cannot read the key: %v", err)
	}
	if err := WriteSwarmKey(path); !errors.Is(err, fs.ErrExist) {
		t.Errorf("second write: err %v, want it refused as existing", err)
	}
	if b2, _ := os.ReadFile(path); !bytes.Equal(b, b2) {
		t.Error("the existing key was changed")
	}
	other := filepath.Join(t.TempDir(), "other.key")
	if err := WriteSwarmKey(other); err != nil {
		t.Fatal(err)
	}
	if k2, _ := ReadSwarmKey(other); bytes.Equal(k, k2) {
		t.Error("two keys are equal")
	}
}

func TestParseAllowPeers(t *testing.T) {
	a, b := testPeerID(t), testPeerID(t)
	for _, tc := range []struct {
		name, in string
		want     []peer.ID
		err      string
	}{
		{"one", a.String() + "\n", []peer.ID{a}, ""},
		{"comments and blanks", "# job peers\n\n" + a.String() + "  # bootstrap\n  " + b.String() + "\n", []peer.ID{a, b}, ""},
		{"duplicate", a.String() + "\n" + a.String(), []peer.ID{a}, ""},
		{"bad line", a.String() + "\nnot-a-peer\n", nil, "line 2"},
		{"empty", "# nobody\n", nil, "no peer IDs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseAllowPeers(strings.NewReader(tc.in))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want one naming %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Errorf("got %v, want %v", got, tc.want)
				}
			}
		})
	}
}

func TestParseBootstrap(t *testing.T) {
	id := testPeerID(t).String()
	for _, tc := range []struct {
		name  string
		in    []string
		peers int
		err   string
	}{
		{"ip4", []string{"/ip4/10.0.0.1/tcp/4001/p2p/" + id}, 1, ""},
		{"dns4", []string{"/dns4/boot.example/tcp/4001/p2p/" + id}, 1, ""},
		{"dns6", []string{"/dns6/boot.example/udp/4001/quic-v1/p2p/" + id}, 1, ""},
		{"two addresses of one peer", []string{"/ip4/10.0.0.1/tcp/4001/p2p/" + id, "/dns4/boot.example/tcp/4001/p2p/" + id}, 1, ""},
		{"no peer id", []string{"/ip4/10.0.0.1/tcp/4001"}, 0, `"/ip4/10.0.0.1/tcp/4001": must end in /p2p/<peer id>`},
		{"bad peer id", []string{"/ip4/10.0.0.1/tcp/4001/p2p/nope"}, 0, `"/ip4/10.0.0.1/tcp/4001/p2p/nope"`},
		{"not a multiaddr", []string{"10.0.0.1:4001"}, 0, `"10.0.0.1:4001"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseBootstrap(tc.in)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want one containing %s", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != tc.peers || len(got[0].Addrs) != len(tc.in) {
				t.Errorf("got %v, want %d peer(s) with %d address(es)", got, tc.peers, len(tc.in))
			}
		})
	}
}

// Bad network settings are refused by Validate, naming what is wrong.
func TestValidateNetwork(t *testing.T) {
	key := make(pnet.PSK, 32)
	for _, tc := range []struct {
		name string
		set  func(*Config)
		err  string
	}{
		{"key with default listen (QUIC)", func(c *Config) { c.PSK = key }, `Listen: address "/ip4/0.0.0.0/udp/4001/quic-v1" with a swarm key`},
		{"key with TCP", func(c *Config) { c.PSK, c.Listen = key, []string{"/ip4/0.0.0.0/tcp/4001", "/ip6/::/tcp/4001"} }, ""},
		{"key with websocket", func(c *Config) { c.PSK, c.Listen = key, []string{"/ip4/0.0.0.0/tcp/4001/ws"} }, "only TCP"},
		{"short key", func(c *Config) { c.PSK, c.Listen = key[:16], []string{"/ip4/0.0.0.0/tcp/4001"} }, "16 bytes"},
		{"bootstrap without id", func(c *Config) { c.Bootstrap = []string{"/dns4/boot/tcp/4001"} }, `"/dns4/boot/tcp/4001": must end in /p2p/`},
		{"bad retry bounds", func(c *Config) { c.Join.RetryMax = 0 }, "Join.RetryMax 0s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			tc.set(&cfg)
			err := cfg.Validate()
			if tc.err == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("err %v, want one containing %s", err, tc.err)
			}
		})
	}
}
