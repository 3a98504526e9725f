package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
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
		{[]string{"run", "--bootstrap", "/ip4/10.0.0.1/tcp/4001"}, `"/ip4/10.0.0.1/tcp/4001": must end in /p2p/<peer id>`},
		{[]string{"run", "--bootstrap", "10.0.0.1:4001"}, `"10.0.0.1:4001"`},
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
