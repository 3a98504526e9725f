package overlay

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

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
)

// Remembered peers.
//
// An overlay with Config.PeersFile keeps there the peers it knows, so
// that, restarted, it rejoins its job through them even when it has no
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
// peersSaveEvery when the set of peers changed, and by SavePeers (a
// node's leave); an overlay that knows no peer then leaves the file as it
// was.
//
// At start (New) the overlay reads the file, if it is of this job, and
// dials the peers in parallel within JoinTimeout. Those that answer are
// this run's bootstrap peers besides the configured ones: the overlay
// joins through them (and a node's join adopts the job's step, model and
// lineage from them). If none answers it starts as it would have without
// the file.

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

// peerState keeps an overlay's peers file.
type peerState struct {
	path string

	mu     sync.Mutex
	last   []peer.ID // the peers last written, sorted
	closed bool      // Close wrote the last one
	failed bool      // a write failed (warned once)
}

// rememberedPeers reads cfg's peers file and dials its peers over h; it
// returns those that answer, to join through besides the bootstrap peers.
// New calls it before it joins.
func rememberedPeers(ctx context.Context, h host.Host, cfg Config) []peer.AddrInfo {
	path := cfg.PeersFile
	log := cfg.logger().With("component", "overlay", "self", h.ID().ShortString())
	job, peers, err := readPeersFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		log.Warn("ignoring the peers file", "file", path, "err", err)
		return nil
	case job != cfg.Job:
		log.Info("the peers file is of another job: not rejoining through it", "file", path, "job", job)
		return nil
	}
	peers = slices.DeleteFunc(peers, func(ai peer.AddrInfo) bool { return ai.ID == h.ID() })
	if len(peers) == 0 {
		return nil
	}
	dctx, cancel := context.WithTimeout(ctx, cfg.JoinTimeout)
	defer cancel()
	ok := make([]bool, len(peers))
	var wg sync.WaitGroup
	for i, ai := range peers {
		wg.Go(func() { ok[i] = h.Connect(dctx, ai) == nil })
	}
	wg.Wait()
	var back []peer.AddrInfo
	for i, ai := range peers {
		if ok[i] {
			back = append(back, ai)
		}
	}
	if len(back) == 0 {
		log.Warn("no peer remembered from the last run answered: starting without them", "file", path, "remembered", len(peers))
		return nil
	}
	log.Info("rejoining the job through peers remembered from the last run", "file", path, "answered", len(back), "remembered", len(peers))
	return back
}

// keepPeers writes the peers file every peersSaveEvery until Close, when
// the peers changed.
func (o *Overlay) keepPeers() {
	if o.cfg.PeersFile == "" {
		return
	}
	o.state = &peerState{path: o.cfg.PeersFile}
	o.wg.Go(func() {
		t := time.NewTicker(peersSaveEvery)
		defer t.Stop()
		for {
			select {
			case <-o.ctx.Done():
				return
			case <-t.C:
				o.savePeers(false)
			}
		}
	})
}

// SavePeers writes the peers the overlay knows to its peers file
// (Config.PeersFile), whatever they are, for the last time: a node calls
// it as it leaves, while it still knows them. A crash leaves the file of
// the last periodic save.
func (o *Overlay) SavePeers() { o.savePeers(true) }

// savePeers writes the peers the overlay knows to its peers file, if
// they changed since the last write (or, final, whatever they are); an
// overlay that knows none leaves the file as it was. After the final
// write it writes no more.
func (o *Overlay) savePeers(final bool) {
	st := o.state
	if st == nil {
		return
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closed {
		return
	}
	st.closed = final
	net, ps := o.h.Network(), o.h.Peerstore()
	known := o.Peers()
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
	pf := peersFile{Job: o.cfg.Job, Saved: time.Now().UTC().Format(time.RFC3339)}
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
			o.log.Warn("could not write the peers file: a restart will not rejoin through the peers this node knew", "file", st.path, "err", err)
		}
		st.failed = true
		return
	}
	st.last = ids
}
