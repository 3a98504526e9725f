package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"strings"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/pnet"

	"github.com/peterbourgon/ff/v3/ffcli"

	"github.com/pspnode/pspnode/node"
	"github.com/pspnode/pspnode/node/netsetup"
)

// privateJob reads --swarm-key and --allow-peers into cfg. With a key and
// no --listen, the default listen addresses shrink to their TCP ones.
func privateJob(cfg *node.Config, swarmKey, allowPeers string, listenSet bool, log *slog.Logger) error {
	if swarmKey != "" {
		key, err := readSwarmKey(swarmKey)
		if err != nil {
			return usagef("--swarm-key: %w", err)
		}
		cfg.PSK = key
		if !listenSet {
			var tcp []string
			for _, l := range cfg.Listen {
				if netsetup.IsTCPAddr(l) {
					tcp = append(tcp, l)
				}
			}
			cfg.Listen = tcp
		}
		log.Info("private job (--swarm-key): only TCP transports run; QUIC, WebTransport and WebRTC cannot carry a pre-shared key")
	}
	if allowPeers != "" {
		ids, err := readAllowPeers(allowPeers)
		if err != nil {
			return usagef("--allow-peers: %w", err)
		}
		cfg.AllowPeers = ids
		log.Info("allowlist (--allow-peers): refusing every other peer", "peers", len(ids))
	}
	return nil
}

func keygenCommand(stdout, stderr io.Writer) *ffcli.Command {
	flags := newFlagSet("pspnode keygen", stderr)
	swarmKey := flags.String("swarm-key", "", "write a fresh swarm key (kubo's swarm.key format) to this file, with mode 0600; an existing file is never overwritten")
	return &ffcli.Command{
		Name:       "keygen",
		ShortUsage: "pspnode keygen --swarm-key FILE",
		ShortHelp:  "write a fresh swarm key for a private job (give every node of the job a copy)",
		FlagSet:    flags,
		Options:    envOptions(),
		Exec: func(_ context.Context, args []string) error {
			if len(args) > 0 {
				return usagef("keygen takes no arguments, got %q", args)
			}
			if *swarmKey == "" {
				return usagef("--swarm-key FILE is required")
			}
			if err := writeSwarmKey(*swarmKey); err != nil {
				if errors.Is(err, fs.ErrExist) {
					return usagef("%s exists: refusing to overwrite a job's key (remove it first if you mean to)", *swarmKey)
				}
				return err
			}
			_, err := io.WriteString(stdout, "wrote "+*swarmKey+" (mode 0600): copy it to every node of the job, and pass --swarm-key\n")
			return err
		},
	}
}

// The files of a private job: the swarm key (go-libp2p's private network,
// the swarm.key file kubo uses) and the allowlist of peer IDs.

// swarmKeyHeader starts a swarm.key file in the base16 encoding kubo writes.
const swarmKeyHeader = "/key/swarm/psk/1.0.0/\n/base16/\n"

// encodeSwarmKey returns key in swarm.key format.
func encodeSwarmKey(key pnet.PSK) []byte {
	return []byte(swarmKeyHeader + hex.EncodeToString(key) + "\n")
}

// parseSwarmKey reads a swarm.key file's contents (base16, base64 or bin
// encodings, as kubo reads them): a 32-byte key.
func parseSwarmKey(b []byte) (pnet.PSK, error) {
	key, err := pnet.DecodeV1PSK(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("swarm key: %w (want %q and 64 hex digits)", err, swarmKeyHeader)
	}
	return key, nil
}

// readSwarmKey reads a swarm.key file.
func readSwarmKey(path string) (pnet.PSK, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("swarm key: %w", err)
	}
	key, err := parseSwarmKey(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return key, nil
}

// writeSwarmKey writes a fresh random key to path in swarm.key format, with
// mode 0600. It refuses to overwrite an existing file: a job's key replaced
// by mistake locks every node holding the old one out.
func writeSwarmKey(path string) error {
	key := make(pnet.PSK, 32)
	if _, err := rand.Read(key); err != nil {
		return fmt.Errorf("swarm key: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("swarm key: %w", err)
	}
	_, err = f.Write(encodeSwarmKey(key)) // mode 0600 at most: a umask only removes bits
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

// parseAllowPeers reads an allowlist: one peer ID per line; blank lines and
// everything after a '#' are ignored. An unparsable line is an error naming
// its number.
func parseAllowPeers(r io.Reader) ([]peer.ID, error) {
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

// readAllowPeers reads an allowlist file (parseAllowPeers).
func readAllowPeers(path string) ([]peer.ID, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("allow peers: %w", err)
	}
	defer f.Close()
	ids, err := parseAllowPeers(f)
	if err != nil {
		return nil, fmt.Errorf("allow peers %s: %w", path, err)
	}
	return ids, nil
}
