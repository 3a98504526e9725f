package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
)

// Remembered peers.
//
// A node with Config.PeersFile keeps there the peers it knows, so that,
// restarted, it rejoins its job through them even when it has no
// bootstrap peer of its own (the job's first node), or in addition to
// those it has. pspnode run keeps the file beside the identity file
// (FILE.peers for --identity FILE). The file is JSON:
//
//	{"job": "demo", "saved": "2025-01-01T00:00:00Z",
//	 "peers": [{"id": "12D3KooW…", "addrs": ["/ip4/192.0.2.7/tcp/4001"]}]}
//
// At most 32 peers, connected ones first, each with at most 8 addresses
// from the peerstore. It is written atomically (a temporary file in the
// same directory, renamed over the old one), mode 0600, every
// peersSaveEvery when the set of peers changed, and at Close; a node that
// knows no peer then leaves the file as it was.
//
// At start (New) the node reads the file, if it is of this job, and dials
// the peers in parallel within Overlay.JoinTimeout. Those that answer are
// this run's bootstrap peers besides Config.Bootstrap: the overlay joins
// through them, and Run's join waits for a peer and adopts the job's step,
// model and lineage from them. If none answers the node starts as it
// would have without the file: a first node then starts a new lineage,
// which converges on the job's if the two meet later (genesis.go).

const (
	peersSaveEvery = 30 * time.Second
	maxSavedPeers  = 32
	maxSavedAddrs  = 8
	maxPeersFile   = 1 << 20
)

// peersFile is the content of a PeersFile.
type peersFile struct {
	Job   string      `json:"job"`
	Saved string      `json:"saved,omitempty"`
	Peers []savedPeer `json:"peers"`
}

type savedPeer struct {
	ID    string   `json:"id"`
	Addrs []string `json:"addrs"`
}

// readPeersFile reads a peers file (see Config.PeersFile): the job it is
// of and its peers. Entries that do not parse are left out.
func readPeersFile(path string) (job string, peers []peer.AddrInfo, err error) {
	f, err := os.Open(path)
	if err != nil {
		return "", nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxPeersFile+1))
	if err != nil {
		return "", nil, err
	}
	if len(b) > maxPeersFile {
		return "", nil, fmt.Errorf("peers file %s: larger than %d bytes", path, maxPeersFile)
	}
	var pf peersFile
	if err := json.Unmarshal(b, &pf); err != nil {
		return "", nil, fmt.Errorf("peers file %s: %w", path, err)
	}
	for _, sp := range pf.Peers {
		id, err := peer.Decode(sp.ID)
		if err != nil {
			continue
		}
		ai := peer.AddrInfo{ID: id}
		for _, s := range sp.Addrs {
			if a, err := ma.NewMultiaddr(s); err == nil {
				ai.Addrs = append(ai.Addrs, a)
			}
		}
		if len(ai.Addrs) > 0 {
			peers = addInfo(peers, ai)
		}
	}
	return pf.Job, peers, nil
}

// writePeersFile writes pf to path atomically, mode 0600.
func writePeersFile(path string, pf peersFile) error {
	b, err := json.MarshalIndent(pf, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".peers-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // a no-op once renamed
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// peerState keeps a node's peers file.
type peerState struct {
	path string

	mu     sync.Mutex
	last   []peer.ID // the peers last written, sorted
	closed bool      // Close wrote the last one
	failed bool      // a write failed (warned once)
}

// rejoinRemembered reads the peers file and dials its peers; those that
// answer become bootstrap peers of this run (n.cfg.Overlay.BootstrapPeers).
// New calls it before it builds the overlay.
func (n *Node) rejoinRemembered(ctx context.Context) {
	path := n.cfg.PeersFile
	if path == "" {
		return
	}
	n.state = &peerState{path: path}
	job, peers, err := readPeersFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return
	case err != nil:
		n.log.Warn("ignoring the peers file", "file", path, "err", err)
		return
	case job != n.cfg.Job:
		n.log.Info("the peers file is of another job: not rejoining through it", "file", path, "job", job)
		return
	}
	peers = slices.DeleteFunc(peers, func(ai peer.AddrInfo) bool { return ai.ID == n.h.ID() })
	if len(peers) == 0 {
		return
	}
	dctx, cancel := context.WithTimeout(ctx, n.cfg.Overlay.JoinTimeout)
	defer cancel()
	ok := make([]bool, len(peers))
	var wg sync.WaitGroup
	for i, ai := range peers {
		wg.Go(func() { ok[i] = n.h.Connect(dctx, ai) == nil })
	}
	wg.Wait()
	var back []peer.AddrInfo
	for i, ai := range peers {
		if ok[i] {
			back = append(back, ai)
		}
	}
	if len(back) == 0 {
		n.log.Warn("no peer remembered from the last run answered: starting without them", "file", path, "remembered", len(peers))
		return
	}
	n.log.Info("rejoining the job through peers remembered from the last run", "file", path, "answered", len(back), "remembered", len(peers))
	n.cfg.Overlay.BootstrapPeers = append(slices.Clip(n.cfg.Overlay.BootstrapPeers), back...)
}

// keepPeers writes the peers file every peersSaveEvery while the node
// lives, when its peers changed.
func (n *Node) keepPeers() {
	if n.state == nil {
		return
	}
	go n.every(peersSaveEvery, func() { n.savePeers(false) })
}

// every calls fn every period until the node's life ends: the loop of the
// node's periodic background chores, run on a goroutine of its own.
func (n *Node) every(period time.Duration, fn func()) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-n.life.Done():
			return
		case <-t.C:
			fn()
		}
	}
}

// savePeers writes the peers the node knows to its peers file, if they
// changed since the last write (or, final, whatever they are); a node
// that knows none leaves the file as it was. After the final write (at
// Close) it writes no more.
func (n *Node) savePeers(final bool) {
	st := n.state
	if st == nil || n.ov == nil {
		return
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closed {
		return
	}
	st.closed = final
	net, ps := n.h.Network(), n.h.Peerstore()
	known := n.ov.Peers()
	// Connected peers first: they are the likeliest to be there next time.
	slices.SortStableFunc(known, func(a, b peer.ID) int {
		ca, cb := net.Connectedness(a) == network.Connected, net.Connectedness(b) == network.Connected
		switch {
		case ca == cb:
			return 0
		case ca:
			return -1
		}
		return 1
	})
	pf := peersFile{Job: n.cfg.Job, Saved: time.Now().UTC().Format(time.RFC3339)}
	var ids []peer.ID
	for _, p := range known {
		if len(pf.Peers) == maxSavedPeers {
			break
		}
		sp := savedPeer{ID: p.String()}
		for _, a := range ps.Addrs(p) {
			if len(sp.Addrs) == maxSavedAddrs {
				break
			}
			sp.Addrs = append(sp.Addrs, a.String())
		}
		if len(sp.Addrs) > 0 {
			pf.Peers = append(pf.Peers, sp)
			ids = append(ids, p)
		}
	}
	slices.Sort(ids)
	if len(ids) == 0 || slices.Equal(ids, st.last) && !final {
		return
	}
	if err := writePeersFile(st.path, pf); err != nil {
		if !st.failed {
			n.log.Warn("could not write the peers file: a restart will not rejoin through the peers this node knew", "file", st.path, "err", err)
		}
		st.failed = true
		return
	}
	st.last = ids
}
