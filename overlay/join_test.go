package overlay

import (
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
)

// testPeerID is a fresh peer ID.
func testPeerID(t *testing.T) peer.ID {
	t.Helper()
	k, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	id, err := peer.IDFromPrivateKey(k)
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

func TestPeersFileFormat(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a.key.peers")
	id := "12D3KooWA4Xop1JaT3MHxwYMkCepYsv4iPVopMXwCz5iHYdBfeSB"
	pf := peersFile{Job: "demo", Peers: []savedPeer{
		{ID: id, Addrs: []string{"/ip4/192.0.2.7/tcp/4001", "not an address"}},
		{ID: "not a peer", Addrs: []string{"/ip4/192.0.2.8/tcp/4001"}},
		{ID: id, Addrs: []string{"/ip4/192.0.2.7/udp/4001/quic-v1"}},
	}}
	if err := writePeersFile(path, pf); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("peers file mode %v, %v; want 0600", fi.Mode().Perm(), err)
	}
	job, peers, err := readPeersFile(path)
	if err != nil || job != "demo" || len(peers) != 1 || peers[0].ID.String() != id || len(peers[0].Addrs) != 2 {
		t.Fatalf("read back job %q, peers %v, %v", job, peers, err)
	}
	if err := os.WriteFile(path, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := readPeersFile(path); err == nil {
		t.Error("a corrupt peers file read without an error")
	}
}
