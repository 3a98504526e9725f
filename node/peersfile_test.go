package node

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

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
	cfgA.Identity, cfgA.Overlay.PeersFile = key, path
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
	job, peers, err := readPeers(t, path)
	if err != nil || job != cfgA.Job || !slices.Contains(peers, b.ID().String()) {
		t.Fatalf("the peers file after Close: job %q, peers %v, %v", job, peers, err)
	}

	a2 := startNode(t, cfgA) // the same identity and file, still no bootstrap
	if !slices.ContainsFunc(a2.ov.BootstrapPeers(), func(ai peer.AddrInfo) bool { return ai.ID == b.ID() }) {
		t.Errorf("the restarted node does not join through the remembered peer: bootstrap %v", a2.ov.BootstrapPeers())
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
	if _, peers, err := readPeers(t, path); err != nil || len(peers) == 0 {
		t.Errorf("a node that knew no peer emptied its peers file: %v, %v", peers, err)
	}

	// Another job's file is not used.
	cfgC := cfgA
	cfgC.Job = "anotherjob"
	c := startNode(t, cfgC)
	if len(c.ov.BootstrapPeers()) != 0 {
		t.Errorf("a node of another job joins through the file's peers: %v", c.ov.BootstrapPeers())
	}
}

// readPeers reads a peers file as its format says (package overlay): the
// job and the peers' IDs.
func readPeers(t *testing.T, path string) (job string, peers []string, err error) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		return "", nil, err
	}
	var f struct {
		Job   string `json:"job"`
		Peers []struct {
			ID string `json:"id"`
		} `json:"peers"`
	}
	err = json.Unmarshal(b, &f)
	for _, p := range f.Peers {
		peers = append(peers, p.ID)
	}
	return f.Job, peers, err
}
