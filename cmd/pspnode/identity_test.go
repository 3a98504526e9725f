package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestIdentityCreatedOnceWithMode0600(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "node.key")
	k1, err := loadOrCreateIdentity(path)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v, %v; want 0600", st.Mode().Perm(), err)
	}
	k2, err := loadOrCreateIdentity(path)
	if err != nil || !k1.Equals(k2) {
		t.Fatalf("second load gave another key: %v", err)
	}
}

func TestIdentityErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.key")
	_ = os.WriteFile(bad, []byte("not a key"), 0o600)
	if _, err := loadOrCreateIdentity(bad); err == nil || !strings.Contains(err.Error(), "not a libp2p private key") {
		t.Errorf("corrupt key: %v", err)
	}
	if b, _ := os.ReadFile(bad); string(b) != "not a key" {
		t.Error("a corrupt key file must not be overwritten")
	}
}
