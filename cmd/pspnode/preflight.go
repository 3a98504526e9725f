package main

import (
	"errors"
	"io/fs"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/pspnode/pspnode/internal/builtin"
	"github.com/pspnode/pspnode/model"
	"github.com/pspnode/pspnode/node"
	nodestatus "github.com/pspnode/pspnode/node/status"
)

// This file holds what `pspnode run` checks before it builds its node, so
// that a bad flag, spec, address or file exits 2 with a message naming the
// flag (docs/cli.md), and does so before the node prints its addresses or
// dials anyone.

// checkModel checks a --model spec: none, linreg, logreg, mlp or mlp:H.
func checkModel(name string) error {
	switch {
	case name == "none", name == "linreg", name == "logreg", name == "mlp":
		return nil
	case strings.HasPrefix(name, "mlp:"):
		if h, err := strconv.Atoi(strings.TrimPrefix(name, "mlp:")); err == nil && h >= 1 {
			return nil
		}
		return usagef("--model %q: H in mlp:H is the hidden layer's width, a whole number >= 1", name)
	}
	return usagef("--model %q: want none, linreg, logreg, mlp or mlp:H (H hidden units)", name)
}

// checkData checks a --data spec: synthetic, mnist or mnist:DIR (and the
// synthetic:regression and synthetic:classification that synthetic
// stands for, which model.Open takes too).
func checkData(spec string) error {
	switch {
	case spec == "synthetic", spec == "mnist",
		spec == "synthetic:regression", spec == "synthetic:classification":
		return nil
	case strings.HasPrefix(spec, "mnist:"):
		if strings.TrimPrefix(spec, "mnist:") == "" {
			return usagef("--data %q: mnist:DIR needs a directory", spec)
		}
		return nil
	}
	return usagef("--data %q: want synthetic, mnist (the MNIST test set built in) or mnist:DIR (a directory of IDX files)", spec)
}

// openData opens the dataset of --data for --model (none needs none).
func openData(modelName, spec string) (model.Data, error) {
	if err := checkData(spec); err != nil {
		return model.Data{}, err
	}
	if modelName == "none" {
		return model.Data{}, nil
	}
	d, err := model.Open(builtin.DataFor(modelName, spec))
	if err != nil {
		return model.Data{}, usagef("--data %s: %v", spec, err)
	}
	return d, nil
}

// loadIdentity loads the key of --identity, creating it if the file does
// not exist. A file that exists but holds no key (empty, truncated, some
// other file) is a usage error: creating a fresh key over it would change
// the node's peer ID behind its operator's back.
func loadIdentity(path string) (crypto.PrivKey, error) {
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, usagef("--identity %s: %v", path, pathErr(err))
	case len(b) == 0:
		return nil, usagef("--identity %s: the file is empty, not a private key (remove it to have a fresh key created there)", path)
	default:
		if _, err := crypto.UnmarshalPrivateKey(b); err != nil {
			return nil, usagef("--identity %s: not a libp2p private key (%v); 'pspnode id --identity NEWFILE' creates one", path, err)
		}
	}
	key, err := loadOrCreateIdentity(path)
	if err != nil {
		return nil, usagef("--identity %s: %v", path, err)
	}
	return key, nil
}

// checkCheckpoint checks that --checkpoint names a file the node can write
// as it will: a temporary file beside it, renamed over it.
func checkCheckpoint(path string) error {
	if path == "" {
		return nil
	}
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		return usagef("--checkpoint %s is a directory: name a file", path)
	}
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, ".checkpoint-*")
	if err != nil {
		return usagef("--checkpoint %s: cannot write in %s: %v", path, dir, pathErr(err))
	}
	name := f.Name()
	err = f.Close()
	if rerr := os.Remove(name); err == nil {
		err = rerr
	}
	if err != nil {
		return usagef("--checkpoint %s: cannot write in %s: %v", path, dir, pathErr(err))
	}
	return nil
}

// pathErr is err without the path an *fs.PathError repeats.
func pathErr(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// probeListen turns the bind test of checkListen on; the test of what
// follows when the test misses a taken port turns it off.
var probeListen = true

// listenSocket is the kernel socket a listen multiaddr needs.
type listenSocket struct {
	network string // tcp4, tcp6, udp4 or udp6
	addr    string // host:port
	port    int
}

// listenForm parses a --listen multiaddr into the socket it needs, or
// says why pspnode cannot listen on it. The forms are those of the
// node's transports: TCP (plain or /ws), QUIC v1 (plain or
// /webtransport) and WebRTC direct.
func listenForm(a ma.Multiaddr) (listenSocket, error) {
	const want = "want /ip4/ADDR or /ip6/ADDR, then /tcp/PORT (optionally /ws), /udp/PORT/quic-v1 (optionally /webtransport) or /udp/PORT/webrtc-direct"
	if len(a) < 2 {
		return listenSocket{}, errors.New(want)
	}
	var s listenSocket
	var family string
	switch a[0].Code() {
	case ma.P_IP4:
		family = "4"
	case ma.P_IP6:
		family = "6"
	default:
		return listenSocket{}, errors.New(want)
	}
	port, err := strconv.Atoi(a[1].Value())
	if err != nil {
		return listenSocket{}, errors.New(want)
	}
	s.port, s.addr = port, net.JoinHostPort(a[0].Value(), a[1].Value())
	rest := make([]int, 0, len(a)-2)
	for _, c := range a[2:] {
		rest = append(rest, c.Code())
	}
	switch a[1].Code() {
	case ma.P_TCP:
		s.network = "tcp" + family
		if len(rest) == 0 || slices.Equal(rest, []int{ma.P_WS}) {
			return s, nil
		}
	case ma.P_UDP:
		s.network = "udp" + family
		if slices.Equal(rest, []int{ma.P_QUIC_V1}) || slices.Equal(rest, []int{ma.P_QUIC_V1, ma.P_WEBTRANSPORT}) ||
			slices.Equal(rest, []int{ma.P_WEBRTC_DIRECT}) {
			return s, nil
		}
	}
	return listenSocket{}, errors.New(want)
}

// checkListen parses the listen addresses and binds each fixed port the
// way a second process would, without SO_REUSEPORT, then lets it go.
// go-libp2p's TCP listener sets SO_REUSEPORT, so two nodes on one address
// both start and the kernel splits inbound dials between two peer IDs; and
// with several addresses go-libp2p starts if any one of them listens, so a
// taken port would drop its address silently. This bind fails on a port
// any other socket holds. explicit says the addresses came from --listen;
// the defaults (TCP and QUIC, IPv4 and IPv6, port 4001) are skipped when
// the machine cannot bind them at all (no IPv6), as go-libp2p skips them,
// but not when their port is taken. It returns the addresses the host
// must then listen on (checkListening).
func checkListen(addrs []string, explicit bool) ([]ma.Multiaddr, error) {
	name := "--listen"
	if !explicit {
		name = "--listen (default " + strings.Join(addrs, ",") + ")"
	}
	var want []ma.Multiaddr
	probed := map[listenSocket]error{}
	for _, s := range addrs {
		a, err := ma.NewMultiaddr(s)
		if err != nil {
			return nil, usagef("--listen %q: %v", s, err)
		}
		sock, err := listenForm(a)
		if err != nil {
			return nil, usagef("--listen %q: %v", s, err)
		}
		if sock.port == 0 || !probeListen {
			want = append(want, a)
			continue
		}
		err, seen := probed[sock]
		if !seen {
			err = probe(sock)
			probed[sock] = err
		}
		switch {
		case err == nil:
			want = append(want, a)
		case errors.Is(err, syscall.EADDRINUSE):
			return nil, usagef("%s: %s port %d on %s is already in use (another pspnode?): choose another port with --listen",
				name, strings.ToUpper(sock.network[:3]), sock.port, a[0].Value())
		case explicit:
			return nil, usagef("--listen %s: %v", s, err)
		}
	}
	return want, nil
}

// probe binds sock and closes it.
func probe(sock listenSocket) error {
	var c interface{ Close() error }
	var err error
	if strings.HasPrefix(sock.network, "tcp") {
		c, err = net.Listen(sock.network, sock.addr)
	} else {
		c, err = net.ListenPacket(sock.network, sock.addr)
	}
	if err != nil {
		var oe *net.OpError
		if errors.As(err, &oe) {
			return oe.Err
		}
		return err
	}
	return c.Close()
}

// checkListening checks that the host listens on every address of want
// (port 0: any port), which catches a port taken between checkListen and
// the host's start.
func checkListening(h host.Host, want []ma.Multiaddr) error {
	have := h.Network().ListenAddresses()
	for _, w := range want {
		if !slices.ContainsFunc(have, func(a ma.Multiaddr) bool { return listensOn(a, w) }) {
			return usagef("--listen %s: the node could not listen there (listening on %v): is the port taken?", w, have)
		}
	}
	return nil
}

// listensOn reports whether the listen address a serves the requested
// address w: the same components, any port where w's is 0, and a's
// certificate hashes (WebTransport) after them.
func listensOn(a, w ma.Multiaddr) bool {
	if len(a) < len(w) {
		return false
	}
	for i, c := range w {
		if a[i].Code() != c.Code() {
			return false
		}
		port := c.Code() == ma.P_TCP || c.Code() == ma.P_UDP
		if a[i].Value() != c.Value() && !(port && c.Value() == "0") {
			return false
		}
	}
	for _, c := range a[len(w):] {
		if c.Code() != ma.P_CERTHASH {
			return false
		}
	}
	return true
}

// listenHTTP binds --http before the node is built, so that a taken
// address fails the start before the node announces itself.
func listenHTTP(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		var oe *net.OpError
		if errors.As(err, &oe) {
			err = oe.Err
		}
		return nil, usagef("--http %s: %v", addr, err)
	}
	return ln, nil
}

// preflight is what `pspnode run` checks and binds before it builds its
// node: the task's flags, the checkpoint file, the listen ports and the
// HTTP listener.
type preflight struct {
	listen []ma.Multiaddr // what the host must listen on once started
	http   net.Listener   // nil without --http
}

// runPreflight checks --model, --data's spec and --checkpoint, then
// --listen's ports, then binds --http.
func runPreflight(modelName, data, checkpoint string, listen []string, listenSet bool, httpAddr string) (*preflight, error) {
	if err := checkModel(modelName); err != nil {
		return nil, err
	}
	if err := checkData(data); err != nil {
		return nil, err
	}
	if err := checkCheckpoint(checkpoint); err != nil {
		return nil, err
	}
	want, err := checkListen(listen, listenSet)
	if err != nil {
		return nil, err
	}
	p := &preflight{listen: want}
	if httpAddr != "" {
		if p.http, err = listenHTTP(httpAddr); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// Close releases the HTTP listener if nothing took it over.
func (p *preflight) Close() {
	if p.http != nil {
		_ = p.http.Close()
	}
}

// serve serves the node's /status and /metrics on the bound --http
// listener, which the server then owns; with withPprof, Go's profiles
// under /debug/pprof/ too.
func (p *preflight) serve(nd *node.Node, withPprof bool) *nodestatus.Server {
	h := nd.Handler()
	if withPprof {
		mux := http.NewServeMux()
		mux.Handle("/", h)
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		h = mux
	}
	s := nodestatus.ServeOn(p.http, h)
	p.http = nil
	return s
}
