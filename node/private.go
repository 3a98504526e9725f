package node

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/pnet"
	ma "github.com/multiformats/go-multiaddr"
)

// A private job: a pre-shared key (go-libp2p's private network, the
// swarm.key file kubo uses) that every connection's bytes are encrypted
// with before anything else is said, and an allowlist of peer IDs enforced
// by a connection gater (gate.go).

// swarmKeyHeader starts a swarm.key file in the base16 encoding kubo writes.
const swarmKeyHeader = "/key/swarm/psk/1.0.0/\n/base16/\n"

// EncodeSwarmKey returns key in swarm.key format.
func EncodeSwarmKey(key pnet.PSK) []byte {
	return []byte(swarmKeyHeader + hex.EncodeToString(key) + "\n")
}

// ParseSwarmKey reads a swarm.key file's contents (base16, base64 or bin
// encodings, as kubo reads them): a 32-byte key.
func ParseSwarmKey(b []byte) (pnet.PSK, error) {
	key, err := pnet.DecodeV1PSK(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("swarm key: %w (want %q and 64 hex digits)", err, swarmKeyHeader)
	}
	return key, nil
}

// ReadSwarmKey reads a swarm.key file.
func ReadSwarmKey(path string) (pnet.PSK, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("swarm key: %w", err)
	}
	key, err := ParseSwarmKey(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return key, nil
}

// WriteSwarmKey writes a fresh random key to path in swarm.key format, with
// mode 0600. It refuses to overwrite an existing file: a job's key replaced
// by mistake locks every node holding the old one out.
func WriteSwarmKey(path string) error {
	key := make(pnet.PSK, 32)
	if _, err := rand.Read(key); err != nil {
		return fmt.Errorf("swarm key: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("swarm key: %w", err)
	}
	_, err = f.Write(EncodeSwarmKey(key)) // mode 0600 at most: a umask only removes bits
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(path)
		return fmt.Errorf("swarm key: %w", err)
	}
	return nil
}

// ParseAllowPeers reads an allowlist: one peer ID per line; blank lines and
// everything after a '#' are ignored. An unparsable line is an error naming
// its number.
func ParseAllowPeers(r io.Reader) ([]peer.ID, error) {
	var out []peer.ID
	seen := make(map[peer.ID]bool)
	sc := bufio.NewScanner(r)
	for line := 1; sc.Scan(); line++ {
		s, _, _ := strings.Cut(sc.Text(), "#")
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		id, err := peer.Decode(s)
		if err != nil {
			return nil, fmt.Errorf("line %d: %q is not a peer ID: %w", line, s, err)
		}
		if !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, errors.New("no peer IDs: an empty allowlist would refuse every peer")
	}
	return out, nil
}

// ReadAllowPeers reads an allowlist file (ParseAllowPeers).
func ReadAllowPeers(path string) ([]peer.ID, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("allow peers: %w", err)
	}
	defer f.Close()
	ids, err := ParseAllowPeers(f)
	if err != nil {
		return nil, fmt.Errorf("allow peers %s: %w", path, err)
	}
	return ids, nil
}

// validateNetwork checks the bootstrap addresses, the swarm key and the
// allowlist.
func (c Config) validateNetwork() []error {
	var errs []error
	if _, err := c.bootstrapPeers(""); err != nil {
		errs = append(errs, fmt.Errorf("Bootstrap: %w", err))
	}
	if err := c.Join.validate(); err != nil {
		errs = append(errs, err)
	}
	if len(c.PSK) == 0 {
		return errs
	}
	if len(c.PSK) != 32 {
		errs = append(errs, fmt.Errorf("PSK: swarm key of %d bytes: want 32", len(c.PSK)))
	}
	for _, l := range c.Listen {
		if !IsTCPAddr(l) {
			errs = append(errs, fmt.Errorf("Listen: address %q with a swarm key: only TCP runs in a private network (QUIC, WebTransport and WebRTC cannot carry a pre-shared key)", l))
		}
	}
	return errs
}

// IsTCPAddr reports whether a listen multiaddr is plain TCP (no WebSocket
// or other protocol on top).
func IsTCPAddr(s string) bool {
	a, err := ma.NewMultiaddr(s)
	if err != nil || len(a) == 0 {
		return false
	}
	return a[len(a)-1].Protocol().Code == ma.P_TCP
}
