package node

import (
	"crypto/rand"
	"strings"
	"testing"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/pnet"
)

// newIdentity makes a fresh Ed25519 key, as pspnode run does without
// --identity.
func newIdentity() (crypto.PrivKey, error) {
	k, _, err := crypto.GenerateEd25519Key(rand.Reader)
	return k, err
}

func peerIDOf(k crypto.PrivKey) (peer.ID, error) { return peer.IDFromPrivateKey(k) }

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
		{"bootstrap without port", func(c *Config) { c.Bootstrap = []string{"boot.lan"} }, `"boot.lan": want HOST:PORT`},
		{"bad retry bounds", func(c *Config) { c.Overlay.Join.RetryMax = 0 }, "Join.RetryMax 0s"},
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
