package node

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

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

// A node keeps the peers it knew in its peers file, and started again
// (the first node of the job: no bootstrap peers) rejoins through them.
// A node that knows no peer leaves the file as it was, and a file of
// another job is not used.
func TestPeersFileRejoin(t *testing.T) {
	key, err := newIdentity()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "a.key.peers")
	cfgA := tcpConfig()
	cfgA.Identity, cfgA.PeersFile = key, path
	a := startNode(t, cfgA)
	cfgB := tcpConfig()
	cfgB.Bootstrap = []string{a.Addrs()[0].String()}
	b := startNode(t, cfgB)
	if !waitFor(20*time.Second, func() bool { return slices.Contains(a.Overlay().Peers(), b.ID()) }) {
		t.Fatal("the first node did not meet the second")
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	job, peers, err := readPeersFile(path)
	if err != nil || job != cfgA.Job || !slices.ContainsFunc(peers, func(ai peer.AddrInfo) bool { return ai.ID == b.ID() }) {
		t.Fatalf("the peers file after Close: job %q, peers %v, %v", job, peers, err)
	}

	a2 := startNode(t, cfgA) // the same identity and file, still no bootstrap
	if !slices.ContainsFunc(a2.cfg.Overlay.BootstrapPeers, func(ai peer.AddrInfo) bool { return ai.ID == b.ID() }) {
		t.Errorf("the restarted node does not join through the remembered peer: bootstrap %v", a2.cfg.Overlay.BootstrapPeers)
	}
	if !waitFor(20*time.Second, func() bool { return slices.Contains(a2.Overlay().Peers(), b.ID()) }) {
		t.Error("the restarted node did not rejoin the second")
	}
	if !a2.Status().Joined {
		t.Errorf("the restarted node has not joined: %+v", a2.Status().JoinStatus)
	}
	_ = a2.Close()
	_ = b.Close()

	// Alone now: its file keeps the peers it knew.
	a3 := startNode(t, cfgA)
	_ = a3.Close()
	if _, peers, err := readPeersFile(path); err != nil || len(peers) == 0 {
		t.Errorf("a node that knew no peer emptied its peers file: %v, %v", peers, err)
	}

	// Another job's file is not used.
	cfgC := cfgA
	cfgC.Job = "anotherjob"
	c := startNode(t, cfgC)
	if len(c.cfg.Overlay.BootstrapPeers) != 0 {
		t.Errorf("a node of another job joins through the file's peers: %v", c.cfg.Overlay.BootstrapPeers)
	}
}
