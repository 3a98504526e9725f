package main

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

// keygen writes a key with mode 0600 that run accepts, and refuses to
// overwrite it.
func TestKeygen(t *testing.T) {
	key := filepath.Join(t.TempDir(), "swarm.key")
	if code, _, stderr := runCLI(t, "keygen", "--swarm-key", key); code != 0 {
		t.Fatalf("keygen: exit %d: %s", code, stderr)
	}
	fi, err := os.Stat(key)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", fi.Mode().Perm())
	}
	before, _ := os.ReadFile(key)
	code, _, stderr := runCLI(t, "keygen", "--swarm-key", key)
	if code != 2 || !strings.Contains(stderr, "refusing to overwrite") {
		t.Errorf("second keygen: exit %d, %q", code, stderr)
	}
	if after, _ := os.ReadFile(key); string(after) != string(before) {
		t.Error("the key changed")
	}
}

// Bad join and private-job flags are usage errors that say what is wrong.
func TestPrivateJobUsageErrors(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "swarm.key")
	if code, _, stderr := runCLI(t, "keygen", "--swarm-key", key); code != 0 {
		t.Fatal(stderr)
	}
	bad := filepath.Join(dir, "bad.key")
	if err := os.WriteFile(bad, []byte("not a key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	allow := filepath.Join(dir, "allow")
	if err := os.WriteFile(allow, []byte("# peers\nnot-a-peer-id\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"keygen"}, "--swarm-key FILE is required"},
		{[]string{"run", "--bootstrap", "/ip4/10.0.0.1/udp/4001/quic-v1"}, `"/ip4/10.0.0.1/udp/4001/quic-v1": without /p2p/<peer id>`},
		{[]string{"run", "--bootstrap", "10.0.0.1"}, `"10.0.0.1": want HOST:PORT`},
		{[]string{"run", "--swarm-key", filepath.Join(dir, "none")}, "--swarm-key"},
		{[]string{"run", "--swarm-key", bad}, "swarm key"},
		{[]string{"run", "--swarm-key", key, "--listen", "/ip4/127.0.0.1/udp/0/quic-v1"}, `"/ip4/127.0.0.1/udp/0/quic-v1" with a swarm key: only TCP`},
		{[]string{"run", "--allow-peers", allow}, "line 2"},
	} {
		code, _, stderr := runCLI(t, tc.args...)
		if code != 2 || !strings.Contains(stderr, tc.want) {
			t.Errorf("pspnode %v: exit %d (want 2), stderr %q (want it to contain %q)", tc.args, code, stderr, tc.want)
		}
	}
}

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
			k, err := parseSwarmKey([]byte(tc.in))
			if tc.ok != (err == nil) {
				t.Fatalf("parseSwarmKey: err %v, want ok %v", err, tc.ok)
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
	if err := writeSwarmKey(path); err != nil {
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
	if err := writeSwarmKey(path); !errors.Is(err, fs.ErrExist) {
		t.Errorf("second write: err %v, want it refused as existing", err)
	}
	if b2, _ := os.ReadFile(path); !bytes.Equal(b, b2) {
		t.Error("the existing key was changed")
	}
	other := filepath.Join(t.TempDir(), "other.key")
	if err := writeSwarmKey(other); err != nil {
		t.Fatal(err)
	}
	if k2, _ := readSwarmKey(other); bytes.Equal(k, k2) {
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
			got, err := parseAllowPeers(strings.NewReader(tc.in))
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
