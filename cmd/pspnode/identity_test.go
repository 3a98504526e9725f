package main

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/libp2p/go-libp2p/core/crypto"
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

// Processes that start at once with the same new --identity file end with
// one key: each gets the key the file holds.
func TestIdentityCreatedOnceUnderRace(t *testing.T) {
	for round := range 20 {
		path := filepath.Join(t.TempDir(), "node.key")
		const n = 8
		keys := make([]crypto.PrivKey, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Go(func() {
				<-start
				keys[i], errs[i] = loadOrCreateIdentity(path)
			})
		}
		close(start)
		wg.Wait()
		onDisk, err := loadOrCreateIdentity(path)
		if err != nil {
			t.Fatal(err)
		}
		for i := range n {
			if errs[i] != nil {
				t.Fatalf("round %d, caller %d: %v", round, i, errs[i])
			}
			if !keys[i].Equals(onDisk) {
				t.Fatalf("round %d: caller %d got a key that is not the file's", round, i)
			}
		}
		if left, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".identity-*")); len(left) > 0 {
			t.Fatalf("temporary files left: %v", left)
		}
	}
}

// Two nodes of one machine with one identity file: the second is refused
// with a message that says so, and the file is free again once the first
// lets it go (its process ends).
func TestIdentityInUse(t *testing.T) {
	path := filepath.Join(t.TempDir(), "k")
	if _, err := loadIdentity(path); err != nil {
		t.Fatal(err)
	}
	release, err := lockIdentity(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lockIdentity(path); err == nil || !strings.Contains(err.Error(), "in use by another pspnode") {
		t.Errorf("a second lock of one identity: %v", err)
	}
	release()
	again, err := lockIdentity(path)
	if err != nil {
		t.Fatalf("after the first let it go: %v", err)
	}
	again()
}
