package main

import (
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Every node of a private job started with one HOST:PORT, as DDP's ranks
// are with MASTER_ADDR:MASTER_PORT, the node at that port included: the
// node at it starts the job, the others learn its peer ID through the
// swarm key and train with it; a node with another key is told that
// nothing of its job answers there.
func TestRunFromAnAddress(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t)
	dir := t.TempDir()
	key, other := filepath.Join(dir, "swarm.key"), filepath.Join(dir, "other.key")
	for _, k := range []string{key, other} {
		if code, _, stderr := runCLI(t, "keygen", "--swarm-key", k); code != 0 {
			t.Fatal(stderr)
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	master := fmt.Sprintf("127.0.0.1:%d", port)
	common := []string{"--http", "127.0.0.1:0", "--job", "address", "--barrier", "pssp:2:2",
		"--time-scale", "0.02", "--log-level", "warn", "--bootstrap", master}
	nodes := []*proc{startNode(t, bin, append(common, "--swarm-key", key, "--listen", fmt.Sprintf("/ip4/127.0.0.1/tcp/%d", port))...)}
	for range 2 {
		nodes = append(nodes, startNode(t, bin, append(common, "--swarm-key", key, "--listen", "/ip4/127.0.0.1/tcp/0")...))
	}
	stranger := startNode(t, bin, append(common, "--swarm-key", other, "--listen", "/ip4/127.0.0.1/tcp/0")...)

	type joinStatus struct {
		status
		Joined    bool   `json:"joined"`
		JoinError string `json:"join_error"`
		Bootstrap int    `json:"bootstrap_peers"`
	}
	get := func(p *proc) joinStatus {
		var s joinStatus
		if err := p.GetJSON("/status", &s); err != nil {
			t.Fatalf("status of %s: %v\nstderr:\n%s", p.ID, err, p.Stderr)
		}
		return s
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		var ss []joinStatus
		done := true
		for _, p := range nodes {
			s := get(p)
			ss = append(ss, s)
			done = done && s.Joined && s.Peers >= 2 && s.Step >= 10 && s.Recv > 0
		}
		if done {
			if ss[0].Bootstrap != 0 {
				t.Errorf("the node at %s counts %d bootstrap peers: it should have found the address its own", master, ss[0].Bootstrap)
			}
			for i, s := range ss[1:] {
				if s.Bootstrap != 1 {
					t.Errorf("node %d: %d bootstrap peers, want the one at %s", i+1, s.Bootstrap, master)
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the nodes started from %s did not train together within 60 s: %+v\nstderr of the second:\n%s", master, ss, nodes[1].Stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for {
		s := get(stranger)
		if s.Joined || s.Peers > 0 {
			t.Fatalf("a node with another swarm key joined the job at %s: %+v", master, s)
		}
		if strings.Contains(s.JoinError, "no libp2p peer answered") && strings.Contains(s.JoinError, "another swarm key") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a node with another swarm key: join error %q, want one saying no node of its key answers at %s", s.JoinError, master)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
