package overlay

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/pnet"
	"github.com/libp2p/go-libp2p/p2p/transport/tcp"
	ma "github.com/multiformats/go-multiaddr"
)

func TestParseRendezvous(t *testing.T) {
	for _, tc := range []struct{ in, want, err string }{
		{"10.0.0.5:29500", "/ip4/10.0.0.5/tcp/29500", ""},
		{"[::1]:29500", "/ip6/::1/tcp/29500", ""},
		{"node0.lan:29500", "/dns/node0.lan/tcp/29500", ""},
		{"/ip4/10.0.0.5/tcp/4001", "/ip4/10.0.0.5/tcp/4001", ""},
		{"/dns4/boot.example/tcp/4001", "/dns4/boot.example/tcp/4001", ""},
		{"10.0.0.5", "", "want HOST:PORT"},
		{"10.0.0.5:0", "", "want 1 to 65535"},
		{"10.0.0.5:70000", "", "want 1 to 65535"},
		{":4001", "", "no host"},
		{"/ip4/10.0.0.5/udp/4001/quic-v1", "", "TCP"},
		{"/ip4/10.0.0.5/tcp/4001/ws", "", "TCP"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			if !IsRendezvous(tc.in) {
				t.Fatalf("IsRendezvous(%q) false", tc.in)
			}
			a, err := ParseRendezvous(tc.in)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %v, %v; want an error containing %q", a, err, tc.err)
				}
				return
			}
			if err != nil || a.String() != tc.want {
				t.Fatalf("got %v, %v; want %s", a, err, tc.want)
			}
		})
	}
	if IsRendezvous("/ip4/10.0.0.5/tcp/4001/p2p/" + testPeerID(t).String()) {
		t.Error("an address with a peer ID taken for one without")
	}
}

// pskHost is a libp2p host on a loopback TCP port (listen, e.g.
// "/ip4/127.0.0.1/tcp/0"), with the swarm key psk when not nil.
func pskHost(t *testing.T, listen string, psk pnet.PSK) host.Host {
	t.Helper()
	opts := []libp2p.Option{libp2p.ListenAddrStrings(listen), libp2p.DisableRelay()}
	if psk != nil {
		opts = append(opts, libp2p.PrivateNetwork(psk), libp2p.Transport(tcp.NewTCPTransport))
	}
	h, err := libp2p.New(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	return h
}

// tcpAddr is h's loopback TCP address as HOST:PORT.
func tcpAddr(t *testing.T, h host.Host) string {
	t.Helper()
	for _, a := range h.Network().ListenAddresses() {
		if port, err := a.ValueForProtocol(ma.P_TCP); err == nil {
			return "127.0.0.1:" + port
		}
	}
	t.Fatalf("%s listens on no TCP address: %v", h.ID(), h.Network().ListenAddresses())
	return ""
}

func swarmKey(t *testing.T) pnet.PSK {
	k := make(pnet.PSK, 32)
	if _, err := rand.Read(k); err != nil {
		t.Fatal(err)
	}
	return k
}

// rendezvousOverlay starts an overlay of job jointest on h, joining
// through the bootstrap addresses boot, with the swarm key psk.
func rendezvousOverlay(t *testing.T, h host.Host, psk pnet.PSK, boot ...string) (*Overlay, error) {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Job, cfg.KeepJoining, cfg.JoinTimeout, cfg.PSK = "jointest", true, 5*time.Second, psk
	cfg.BootstrapAddrs = boot
	o, err := New(context.Background(), h, cfg)
	if err == nil {
		t.Cleanup(func() { _ = o.Close() })
	}
	return o, err
}

// A worker started with the address of the job's first node alone learns
// its peer ID and joins, with and without a swarm key; the first node,
// given its own address, starts the job.
func TestJoinThroughAddress(t *testing.T) {
	for _, private := range []bool{false, true} {
		t.Run(fmt.Sprintf("private=%v", private), func(t *testing.T) {
			var psk pnet.PSK
			if private {
				psk = swarmKey(t)
			}
			h0 := pskHost(t, "/ip4/127.0.0.1/tcp/0", psk)
			addr := tcpAddr(t, h0)
			o0, err := rendezvousOverlay(t, h0, psk, addr)
			if err != nil {
				t.Fatal(err)
			}
			if o0.Joining() || len(o0.BootstrapPeers()) != 0 {
				t.Fatalf("the node at the address: joining %v through %v; want it to start the job", o0.Joining(), o0.BootstrapPeers())
			}
			h1 := pskHost(t, "/ip4/127.0.0.1/tcp/0", psk)
			o1, err := rendezvousOverlay(t, h1, psk, addr)
			if err != nil {
				t.Fatal(err)
			}
			if err := o1.JoinError(); err != nil {
				t.Fatalf("join through %s: %v", addr, err)
			}
			if bp := o1.BootstrapPeers(); len(bp) != 1 || bp[0].ID != h0.ID() {
				t.Fatalf("bootstrap peers %v, want %s", bp, h0.ID())
			}
			eventually(t, 20*time.Second, "the two know each other", func() bool {
				return knowEachOther([]*Overlay{o0, o1}, []host.Host{h0, h1})
			})
		})
	}
}

// A worker started before the job's first node listens keeps trying the
// address and joins once it answers.
func TestJoinThroughAddressBeforeItListens(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	h1 := pskHost(t, "/ip4/127.0.0.1/tcp/0", nil)
	o1, err := rendezvousOverlay(t, h1, nil, addr)
	if err != nil {
		t.Fatal(err)
	}
	if o1.JoinError() == nil || !errors.Is(o1.JoinError(), ErrJoin) || !strings.Contains(o1.JoinError().Error(), "no libp2p peer answered") {
		t.Fatalf("join error %v; want one saying nothing answered at %s", o1.JoinError(), addr)
	}
	if !o1.Joining() {
		t.Fatal("a node whose bootstrap address does not answer yet does not count as joining")
	}
	h0 := pskHost(t, fmt.Sprintf("/ip4/127.0.0.1/tcp/%d", port), nil)
	o0, err := rendezvousOverlay(t, h0, nil, addr)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the late first node found at its address", func() bool {
		st := o1.JoinStatus()
		return st.Joined && st.BootstrapPeers == 1 && knowEachOther([]*Overlay{o0, o1}, []host.Host{h0, h1})
	})
}

// The node at the address restarted with another identity (it starts
// alone, the address being its own): a node that joined through the
// address finds it there at its next split check, and the two meet again.
func TestJoinThroughAddressReplaced(t *testing.T) {
	h0 := pskHost(t, "/ip4/127.0.0.1/tcp/0", nil)
	addr := tcpAddr(t, h0)
	o0, err := rendezvousOverlay(t, h0, nil, addr)
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Job, cfg.KeepJoining, cfg.JoinTimeout, cfg.BootstrapAddrs = "jointest", true, 5*time.Second, []string{addr}
	cfg.Join.SplitCheck, cfg.Join.Check = 200*time.Millisecond, 100*time.Millisecond
	h1 := pskHost(t, "/ip4/127.0.0.1/tcp/0", nil)
	o1, err := New(context.Background(), h1, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = o1.Close() })
	eventually(t, 20*time.Second, "the two know each other", func() bool {
		return knowEachOther([]*Overlay{o0, o1}, []host.Host{h0, h1})
	})
	// A third node keeps o1's routing table from emptying (a job goes on
	// without the node at the address), so only the split check can
	// bring the new node in.
	h2 := pskHost(t, "/ip4/127.0.0.1/tcp/0", nil)
	o2, err := rendezvousOverlay(t, h2, nil, addr)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the three know each other", func() bool {
		return knowEachOther([]*Overlay{o0, o1, o2}, []host.Host{h0, h1, h2})
	})
	_ = o0.Close()
	_ = h0.Close()
	h3 := pskHost(t, "/ip4/"+strings.Replace(addr, ":", "/tcp/", 1), nil)
	o3, err := rendezvousOverlay(t, h3, nil, addr)
	if err != nil {
		t.Fatal(err)
	}
	if o3.Joining() {
		t.Fatal("the restarted node at the address does not start alone")
	}
	eventually(t, 30*time.Second, "the restarted node found again at its address", func() bool {
		return knowEachOther([]*Overlay{o1, o3}, []host.Host{h1, h3})
	})
	if bp := o1.BootstrapPeers(); len(bp) != 1 || bp[0].ID != h3.ID() {
		t.Errorf("bootstrap peers %v: want the one now at %s, %s", bp, addr, h3.ID())
	}
}

// A node of another job at the address is named as such at the first
// attempt, not after the join's timeout.
func TestJoinThroughAddressOfAnotherJob(t *testing.T) {
	h0 := pskHost(t, "/ip4/127.0.0.1/tcp/0", nil)
	cfg := DefaultConfig()
	cfg.Job = "another"
	o0, err := New(context.Background(), h0, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = o0.Close() })
	h1 := pskHost(t, "/ip4/127.0.0.1/tcp/0", nil)
	start := time.Now()
	o1, err := rendezvousOverlay(t, h1, nil, tcpAddr(t, h0)) // JoinTimeout 5 s
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "a join error naming another job", func() bool {
		return strings.Contains(o1.JoinStatus().JoinError, "a node of another job")
	})
	if d := time.Since(start); d >= 5*time.Second {
		t.Errorf("another job's node named after %v: want it before the join's timeout", d)
	}
}

// The pre-handshake proves a holder of the job's key: a node with another
// key (or none) at the address is no peer to learn, and says why.
func TestProbePeerIDRefusesAnotherKey(t *testing.T) {
	k1, k2 := swarmKey(t), swarmKey(t)
	h0 := pskHost(t, "/ip4/127.0.0.1/tcp/0", k1)
	a, err := ParseRendezvous(tcpAddr(t, h0))
	if err != nil {
		t.Fatal(err)
	}
	h1 := pskHost(t, "/ip4/127.0.0.1/tcp/0", nil)
	key := h1.Peerstore().PrivKey(h1.ID())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if id, err := ProbePeerID(ctx, key, k1, a); err != nil || id != h0.ID() {
		t.Fatalf("with the key: %v, %v; want %s", id, err, h0.ID())
	}
	for name, k := range map[string]pnet.PSK{"another key": k2, "no key": nil} {
		id, err := ProbePeerID(ctx, key, k, a)
		if err == nil || !errors.Is(err, ErrNoPeerAtAddress) {
			t.Errorf("%s: learnt %v, %v; want ErrNoPeerAtAddress", name, id, err)
		}
	}
	// Something that is not a libp2p node: refused at once, not waited on.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err == nil {
			_, _ = c.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n"))
			_ = c.Close()
		}
	}()
	other, _ := ParseRendezvous(l.Addr().String())
	if id, err := ProbePeerID(ctx, key, nil, other); !errors.Is(err, ErrNoPeerAtAddress) {
		t.Errorf("an HTTP server: learnt %v, %v; want ErrNoPeerAtAddress", id, err)
	}
}
