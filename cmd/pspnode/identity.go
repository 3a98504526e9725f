package main

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
)

// Identity keys: --identity's file, or a fresh key.

// loadOrCreateIdentity reads the private key in path, or, if the file does
// not exist, creates an Ed25519 key and writes it there with mode 0600. The
// key file holds the libp2p protobuf encoding of the key.
//
// Two processes may start at once with the same --identity (`pspnode id`
// beside `pspnode run`): the key is written whole to a temporary file,
// which is then linked to path, and a link fails if path exists. So one
// key wins, no reader ever sees a half-written file, and the loser reads
// the winner's key rather than replacing it (a rename would: each process
// would then run under its own key, and one's peer ID would not be the
// file's).
func loadOrCreateIdentity(path string) (crypto.PrivKey, error) {
	k, err := readIdentity(path)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return k, err
	}
	k, _, err = crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("identity: generate key: %w", err)
	}
	b, err := crypto.MarshalPrivateKey(k)
	if err != nil {
		return nil, fmt.Errorf("identity: %w", err)
	}
	if dir := filepath.Dir(path); dir != "" {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("identity: %w", err)
		}
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".identity-*")
	if err != nil {
		return nil, fmt.Errorf("identity: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("identity: %w", err)
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("identity: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("identity: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return nil, fmt.Errorf("identity: %w", err)
	}
	if err := os.Link(tmp.Name(), path); err != nil {
		if errors.Is(err, fs.ErrExist) { // another process made it first
			return readIdentity(path)
		}
		return nil, fmt.Errorf("identity: %w", err)
	}
	return k, nil
}

// readIdentity reads an existing key file.
func readIdentity(path string) (crypto.PrivKey, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("identity: %w", err)
	}
	k, err := crypto.UnmarshalPrivateKey(b)
	if err != nil {
		return nil, fmt.Errorf("identity %s: not a libp2p private key: %w", path, err)
	}
	return k, nil
}

// newIdentity makes a fresh Ed25519 key.
func newIdentity() (crypto.PrivKey, error) {
	k, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("identity: generate key: %w", err)
	}
	return k, nil
}

// peerIDOf returns the peer ID of a key.
func peerIDOf(k crypto.PrivKey) (peer.ID, error) {
	id, err := peer.IDFromPrivateKey(k)
	if err != nil {
		return "", fmt.Errorf("identity: %w", err)
	}
	return id, nil
}
