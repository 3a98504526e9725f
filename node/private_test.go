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
