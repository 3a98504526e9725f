package overlay

import (
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/internal/memnet"
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
		// Addresses without a peer ID are checked and left to the join
		// (rendezvous.go).
		{"no peer id", []string{"/ip4/10.0.0.1/tcp/4001"}, 0, ""},
		{"host:port", []string{"10.0.0.1:4001"}, 0, ""},
		{"host:port beside a full address", []string{"10.0.0.1:4001", "/ip4/10.0.0.1/tcp/4001/p2p/" + id}, 1, ""},
		{"no peer id, not TCP", []string{"/ip4/10.0.0.1/udp/4001/quic-v1"}, 0, `"/ip4/10.0.0.1/udp/4001/quic-v1": without /p2p/<peer id>`},
		{"bad peer id", []string{"/ip4/10.0.0.1/tcp/4001/p2p/nope"}, 0, `"/ip4/10.0.0.1/tcp/4001/p2p/nope"`},
		{"no port", []string{"10.0.0.1"}, 0, `"10.0.0.1": want HOST:PORT`},
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
			full := 0
			for _, a := range tc.in {
				if !IsRendezvous(a) {
					full++
				}
			}
			if len(got) != tc.peers || (tc.peers > 0 && len(got[0].Addrs) != full) {
				t.Errorf("got %v, want %d peer(s) with %d address(es)", got, tc.peers, full)
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

// joinOverlay starts an overlay of job jointest on h with KeepJoining,
// joining through boot, as a node's; closed when the test ends.
func joinOverlay(t *testing.T, h host.Host, boot ...host.Host) *Overlay {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Job, cfg.KeepJoining = "jointest", true
	for _, b := range boot {
		cfg.BootstrapPeers = append(cfg.BootstrapPeers, peer.AddrInfo{ID: b.ID(), Addrs: b.Addrs()})
	}
	o, err := New(context.Background(), h, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = o.Close() })
	return o
}

// memJoinHosts makes n hosts on a fresh in-memory network.
func memJoinHosts(t *testing.T, n int) (*memnet.Net, []host.Host) {
	t.Helper()
	mn := memnet.New(0)
	t.Cleanup(func() { _ = mn.Close() })
	hs := make([]host.Host, n)
	for i := range hs {
		h, err := mn.NewHost(10, 20)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = h.Close() })
		hs[i] = h
	}
	return mn, hs
}

// knowEachOther reports whether every overlay holds every other's host.
func knowEachOther(os []*Overlay, hs []host.Host) bool {
	for i, o := range os {
		peers := o.Peers()
		for j, h := range hs {
			if i != j && !slices.Contains(peers, h.ID()) {
				return false
			}
		}
	}
	return true
}

func groupOf(group1 ...peer.ID) func(peer.ID) int {
	return func(p peer.ID) int {
		if slices.Contains(group1, p) {
			return 1
		}
		return 0
	}
}

// An overlay whose only bootstrap peer is unreachable when it starts does
// not fail: it starts alone, says why it has not joined, retries with
// backoff, and joins once the bootstrap peer can be reached.
func TestJoinAfterBootstrapBecomesReachable(t *testing.T) {
	bubble(t, func(t *testing.T) {
		mn, hs := memJoinHosts(t, 2)
		mn.Partition(groupOf(hs[0].ID()))
		boot := joinOverlay(t, hs[0])
		o := joinOverlay(t, hs[1], hs[0])
		if st := o.JoinStatus(); st.Joined || st.JoinError == "" || st.JoinAttempts != 1 {
			t.Fatalf("cut off from its bootstrap peer: %+v", st)
		}
		time.Sleep(time.Minute)
		if st := o.JoinStatus(); st.Joined || st.JoinAttempts < 4 {
			t.Fatalf("a minute later: %+v, want several attempts", st)
		}
		mn.Heal()
		eventually(t, 2*time.Minute, "the join after the partition healed", func() bool {
			st := o.JoinStatus()
			return st.Joined && st.JoinError == "" && st.JoinAttempts == 0 && knowEachOther([]*Overlay{boot, o}, hs)
		})
	})
}

// Two halves of a job, each joined through a different bootstrap peer,
// meet again: an overlay configured with both dials the one it does not
// know.
func TestSplitMergesThroughBootstrapPeers(t *testing.T) {
	bubble(t, func(t *testing.T) {
		mn, hs := memJoinHosts(t, 4) // b1, b2, x, y
		mn.Partition(groupOf(hs[0].ID(), hs[2].ID()))
		b1, b2 := joinOverlay(t, hs[0]), joinOverlay(t, hs[1])
		x := joinOverlay(t, hs[2], hs[0], hs[1]) // reaches b1 only
		y := joinOverlay(t, hs[3], hs[1])
		eventually(t, time.Minute, "the halves to form", func() bool {
			return knowEachOther([]*Overlay{b1, x}, []host.Host{hs[0], hs[2]}) && knowEachOther([]*Overlay{b2, y}, []host.Host{hs[1], hs[3]})
		})
		mn.Heal()
		eventually(t, 5*time.Minute, "the halves to meet", func() bool {
			return knowEachOther([]*Overlay{b1, b2, x, y}, hs)
		})
		if got := x.JoinStatus().BootstrapRediscovered; got != 1 {
			t.Errorf("x rediscovered %d bootstrap peers, want 1", got)
		}
	})
}

// Join retries dial. A bootstrap address that accepts TCP connections and
// closes them at once fails every attempt; the joiner retries every 50 to
// 400 ms here, and each retry must reach the address. (go-libp2p's own
// dial backoff, 5 s after a failure and more after each next one, made
// most retries fail with "dial backoff" without dialling.) The join's
// error is one line: go-libp2p lists each address dialled on a line of
// its own.
func TestJoinRetriesDial(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var accepted atomic.Int64
	go func() { // ends when l closes
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			_ = c.Close()
		}
	}()
	h := tcpHost(t, nil)
	t.Cleanup(func() { _ = h.Close() })
	cfg := DefaultConfig()
	cfg.Job, cfg.KeepJoining, cfg.JoinTimeout = "jointest", true, 2*time.Second
	cfg.Join.RetryMin, cfg.Join.RetryMax, cfg.Join.Check = 50*time.Millisecond, 400*time.Millisecond, 100*time.Millisecond
	cfg.BootstrapAddrs = []string{fmt.Sprintf("/ip4/127.0.0.1/tcp/%d/p2p/%s", l.Addr().(*net.TCPAddr).Port, testPeerID(t))}
	o, err := New(t.Context(), h, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = o.Close() })
	// The count is the point: retries every 50-400 ms make 6 dials in
	// about a second, go-libp2p's backoff (5 s, then longer) 3 in 30 s.
	deadline := time.Now().Add(30 * time.Second)
	for accepted.Load() < 6 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	st := o.JoinStatus()
	if accepted.Load() < 6 {
		t.Errorf("%d dials reached the bootstrap address in 30 s of retries every 50-400 ms (%d join attempts; last error %q)",
			accepted.Load(), st.JoinAttempts, st.JoinError)
	}
	if strings.Contains(st.JoinError, "dial backoff") {
		t.Errorf("a retry failed on go-libp2p's dial backoff: %q", st.JoinError)
	}
	if st.JoinError == "" || strings.ContainsAny(st.JoinError, "\r\n") {
		t.Errorf("join error %q: want one line", st.JoinError)
	}
}

// An overlay keeps the peers it knew in its peers file, and started again
// on the same identity (the first node of the job: no bootstrap peers)
// rejoins through them. One that knows no peer leaves the file as it
// was, and a file of another job is not used.
func TestPeersFileRejoin(t *testing.T) {
	keyA, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "a.key.peers")
	start := func(job string, key crypto.PrivKey, file string, boot ...peer.AddrInfo) (*Overlay, host.Host) {
		t.Helper()
		h := tcpHost(t, key)
		cfg := fastConfig(job, boot...)
		cfg.PeersFile, cfg.KeepJoining = file, true
		o, err := New(t.Context(), h, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = o.Close(); _ = h.Close() })
		return o, h
	}
	a, ha := start("jointest", keyA, path)
	b, hb := start("jointest", nil, "", peer.AddrInfo{ID: ha.ID(), Addrs: ha.Addrs()})
	eventually(t, 20*time.Second, "the first overlay to meet the second", func() bool { return slices.Contains(a.Peers(), hb.ID()) })
	a.SavePeers() // as a node does when it leaves
	_ = a.Close()
	_ = ha.Close()
	pf, peers, err := readPeersFile(path)
	if err != nil || pf != "jointest" || !slices.ContainsFunc(peers, func(ai peer.AddrInfo) bool { return ai.ID == hb.ID() }) {
		t.Fatalf("the peers file after SavePeers: job %q, peers %v, %v", pf, peers, err)
	}

	a2, _ := start("jointest", keyA, path) // the same identity and file, still no bootstrap
	if !slices.ContainsFunc(a2.BootstrapPeers(), func(ai peer.AddrInfo) bool { return ai.ID == hb.ID() }) {
		t.Errorf("the restarted overlay does not join through the remembered peer: bootstrap %v", a2.BootstrapPeers())
	}
	eventually(t, 20*time.Second, "the restarted overlay to rejoin the second", func() bool { return slices.Contains(a2.Peers(), hb.ID()) })
	if st := a2.JoinStatus(); !st.Joined {
		t.Errorf("the restarted overlay has not joined: %+v", st)
	}
	_ = a2.Close()
	_ = b.Close()

	// Alone now: its file keeps the peers it knew.
	a3, _ := start("jointest", keyA, path)
	a3.SavePeers()
	if _, peers, err := readPeersFile(path); err != nil || len(peers) == 0 {
		t.Errorf("an overlay that knew no peer emptied its peers file: %v, %v", peers, err)
	}

	// Another job's file is not used.
	c, _ := start("anotherjob", keyA, path)
	if len(c.BootstrapPeers()) != 0 {
		t.Errorf("an overlay of another job joins through the file's peers: %v", c.BootstrapPeers())
	}
}

// The joiner's backoff: doubling from RetryMin up to RetryMax, but before
// the first join up to a second, so that a node whose bootstrap peer
// comes up a few seconds after it joins within a second of that (from
// 1 s doubling, it waited up to as long again: 4 s late, 4 s more).
func TestJoinBackoff(t *testing.T) {
	c := DefaultJoinConfig()
	walk := func(first bool, n int) []time.Duration {
		b, out := c.RetryMin, []time.Duration{c.RetryMin}
		for range n {
			b = c.next(b, first)
			out = append(out, b)
		}
		return out
	}
	ms := time.Millisecond
	for _, tc := range []struct {
		name  string
		first bool
		want  []time.Duration
	}{
		{"before the first join", true, []time.Duration{100 * ms, 200 * ms, 400 * ms, 800 * ms, time.Second, time.Second, time.Second}},
		{"after it", false, []time.Duration{100 * ms, 200 * ms, 400 * ms, 800 * ms, 1600 * ms, 3200 * ms, 6400 * ms}},
	} {
		if got := walk(tc.first, len(tc.want)-1); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
	if got := walk(false, 20)[20]; got != c.RetryMax {
		t.Errorf("after 20 failures: %v, want RetryMax %v", got, c.RetryMax)
	}
	slow := JoinConfig{RetryMin: 5 * time.Second, RetryMax: time.Minute}
	if got := slow.next(5*time.Second, true); got != 5*time.Second {
		t.Errorf("a RetryMin above a second before the first join: %v, want it kept", got)
	}
}
