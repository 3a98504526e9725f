package netns

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Prefix starts the name of every namespace this package makes.
const Prefix = "pspnode-"

// cmdTimeout bounds every ip, tc or nft command.
const cmdTimeout = 20 * time.Second

// Check reports what is missing to build a Net: root, ip and tc
// (iproute2), and nft (nftables) when nat is set. The error names each.
func Check(nat bool) error {
	if runtime.GOOS != "linux" {
		return errors.New("the netns transport needs Linux network namespaces")
	}
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root (network namespaces need CAP_SYS_ADMIN and CAP_NET_ADMIN; run as root)")
	}
	tools := []struct{ bin, pkg string }{{"ip", "iproute2"}, {"tc", "iproute2"}}
	if nat {
		tools = append(tools, struct{ bin, pkg string }{"nft", "nftables"})
	}
	for _, t := range tools {
		if _, err := exec.LookPath(t.bin); err != nil {
			missing = append(missing, fmt.Sprintf("%s (Debian package %s)", t.bin, t.pkg))
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("the netns transport needs %s", strings.Join(missing, ", "))
	}
	return nil
}

// run runs one command and returns its stdout; the error carries stderr.
func run(ctx context.Context, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, cmdTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

// Host is one node's place in the network.
type Host struct {
	Index int
	NS    string     // network namespace the node runs in
	IP    netip.Addr // the node's own address (private when NATed)
	// PublicIP is where peers on the bridge see it: IP, or the router's
	// bridge address when NATed.
	PublicIP netip.Addr
	NATed    bool
	Router   string // router namespace, when NATed
	hostVeth string // host-side end on the bridge
	nodeVeth string // the node's end (eth0) lives in NS
	lanVeth  string // the router's end towards the node, in Router
	linked   bool   // on an emulated link (AddLinkedHost), not the bridge
}

// Net is one run's network: a bridge in the host namespace with an
// address of its own (the parent reaches the nodes through it), and the
// namespaces, links, routes and cgroups of its hosts.
type Net struct {
	ID     string
	Bridge string
	HostIP netip.Addr   // the bridge's address
	subnet netip.Prefix // the bridge's /16
	lan    netip.Prefix // the /16 whose /24s are the NATed nodes' LANs

	mu      sync.Mutex
	hosts   []*Host
	cgroups *cgroups     // nil until a quota is set
	neigh   *neighLimits // nil unless raised
	sw      *lswitch     // the emulated links' switch, nil until used
	closed  bool
}

// Options change how New lays out a run's network.
type Options struct {
	// PublicWAN puts the bridge in 7.0.0.0/8 instead of 10.0.0.0/8, so
	// that the nodes on it have addresses libp2p counts as public: AutoNAT
	// tests only public addresses, and relays and hole punching start only
	// from them. NATed nodes' LANs stay in 10.0.0.0/8. The range is real
	// address space: while the run lasts, this machine routes the bridge's
	// /16 of it to the bridge.
	PublicWAN bool
}

// wanOctet is the bridge range's first octet.
func (o Options) wanOctet() byte {
	if o.PublicWAN {
		return 7
	}
	return 10
}

// New makes a bridge for a run: a fresh run ID, a /16 of 10.0.0.0/8 (or
// 7.0.0.0/8, see Options) that no interface of this machine uses, and the
// bridge's address in it. owner (a pid) is recorded in the bridge's alias
// for Sweep.
func New(ctx context.Context, opts ...Options) (*Net, error) {
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	w := o.wanOctet()
	var b [3]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	id := hex.EncodeToString(b[:])
	used, err := usedOctets(ctx, 10)
	if err != nil {
		return nil, err
	}
	usedWAN := used
	if w != 10 {
		if usedWAN, err = usedOctets(ctx, w); err != nil {
			return nil, err
		}
	}
	// Second octets 64..127 for bridges, +64 for NATed LANs; start at a
	// point drawn from the ID so that concurrent runs rarely race for one.
	var a int = -1
	for k := range 64 {
		c := 64 + (int(b[0])+k)%64
		if !usedWAN[c] && !used[c+64] {
			a = c
			break
		}
	}
	if a < 0 {
		return nil, fmt.Errorf("netns: no free %d.x.0.0/16 for the bridge", w)
	}
	n := &Net{
		ID:     id,
		Bridge: "p" + id + "br",
		subnet: netip.PrefixFrom(netip.AddrFrom4([4]byte{w, byte(a), 0, 0}), 16),
		lan:    netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(a + 64), 0, 0}), 16),
		HostIP: netip.AddrFrom4([4]byte{w, byte(a), 0, 1}),
	}
	steps := [][]string{
		{"link", "add", n.Bridge, "type", "bridge"},
		{"link", "set", n.Bridge, "alias", fmt.Sprintf("pspnode pid=%d", os.Getpid())},
		{"addr", "add", n.HostIP.String() + "/16", "dev", n.Bridge},
		{"link", "set", n.Bridge, "up"},
	}
	for i, s := range steps {
		if _, err := run(ctx, "ip", s...); err != nil {
			if i > 0 {
				_, _ = run(context.Background(), "ip", "link", "del", n.Bridge)
			}
			return nil, fmt.Errorf("netns: bridge: %w", err)
		}
	}
	return n, nil
}

// Subnet is the bridge's /16; NATed nodes' LANs are in Subnet's second
// octet + 64.
func (n *Net) Subnet() netip.Prefix { return n.subnet }

// usedOctets returns the second octets of every first.x.y.z address on
// this machine's interfaces.
func usedOctets(ctx context.Context, first byte) (map[int]bool, error) {
	out, err := run(ctx, "ip", "-4", "-o", "addr", "show")
	if err != nil {
		return nil, fmt.Errorf("netns: %w", err)
	}
	used := map[int]bool{}
	for _, f := range strings.Fields(out) {
		ip, _, ok := strings.Cut(f, "/")
		if !ok {
			continue
		}
		if a, err := netip.ParseAddr(ip); err == nil && a.Is4() && a.As4()[0] == first {
			used[int(a.As4()[1])] = true
		}
	}
	// Routes too: a crashed run's bridge may be gone while routes stay.
	return used, nil
}

// addrOf is the i-th address of a /16 from .0.2 on (.0.1 is the host).
func addrOf(p netip.Prefix, i int) netip.Addr {
	a := p.Addr().As4()
	k := i + 2
	a[2], a[3] = byte(k/250), byte(k%250)
	if a[3] < 2 && a[2] > 0 { // skip .0 and .1 of every /24
		a[3] += 250
	}
	return netip.AddrFrom4(a)
}

// AddHost makes node i's namespace and its link to the bridge. With nat
// the node sits behind a router namespace of its own: the router's WAN
// leg is on the bridge, its LAN leg reaches the node on a private /24,
// nftables masquerades what leaves and drops what arrives unasked, except
// TCP from the bridge's host address to httpPort (the parent's /status
// and /metrics reads; peers on the bridge have no route to the LAN).
func (n *Net) AddHost(ctx context.Context, i int, nat bool, httpPort int) (*Host, error) {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil, errors.New("netns: closed")
	}
	h := &Host{Index: i, NS: fmt.Sprintf("%s%s-n%d", Prefix, n.ID, i), NATed: nat}
	n.hosts = append(n.hosts, h) // Close removes whatever part was made
	n.mu.Unlock()
	ipc := func(args ...string) error { _, err := run(ctx, "ip", args...); return err }
	inNS := func(ns string, args ...string) error {
		_, err := run(ctx, "ip", append([]string{"-n", ns}, args...)...)
		return err
	}
	if err := ipc("netns", "add", h.NS); err != nil {
		return nil, fmt.Errorf("netns: %w", err)
	}
	wan := addrOf(n.subnet, i)
	h.hostVeth = fmt.Sprintf("p%sh%d", n.ID, i)
	h.PublicIP = wan
	// The leg on the bridge ends in the node's namespace, or the router's.
	legNS := h.NS
	if nat {
		h.Router = fmt.Sprintf("%s%s-r%d", Prefix, n.ID, i)
		legNS = h.Router
		if err := ipc("netns", "add", h.Router); err != nil {
			return nil, fmt.Errorf("netns: %w", err)
		}
	}
	tmp := fmt.Sprintf("p%sx%d", n.ID, i)
	cmds := [][]string{
		{"link", "add", h.hostVeth, "type", "veth", "peer", "name", tmp},
		{"link", "set", h.hostVeth, "master", n.Bridge},
		{"link", "set", h.hostVeth, "up"},
		{"link", "set", tmp, "netns", legNS},
	}
	for _, c := range cmds {
		if err := ipc(c...); err != nil {
			return nil, fmt.Errorf("netns: host %d: %w", i, err)
		}
	}
	legName := "eth0"
	if nat {
		legName = "wan"
	}
	for _, c := range [][]string{
		{"link", "set", "lo", "up"},
		{"link", "set", tmp, "name", legName},
		{"addr", "add", wan.String() + "/16", "dev", legName},
		{"link", "set", legName, "up"},
	} {
		if err := inNS(legNS, c...); err != nil {
			return nil, fmt.Errorf("netns: host %d: %w", i, err)
		}
	}
	if !nat {
		h.IP, h.nodeVeth = wan, "eth0"
		return h, nil
	}
	if err := n.addLAN(ctx, h, wan, httpPort); err != nil {
		return nil, err
	}
	return h, nil
}

// addLAN puts NATed host h behind its router, whose WAN leg has address
// wan on the bridge: the LAN between them, forwarding, the router's
// nftables rules (natRules), and the parent's route to the LAN.
func (n *Net) addLAN(ctx context.Context, h *Host, wan netip.Addr, httpPort int) error {
	i := h.Index
	ipc := func(args ...string) error { _, err := run(ctx, "ip", args...); return err }
	inNS := func(ns string, args ...string) error {
		_, err := run(ctx, "ip", append([]string{"-n", ns}, args...)...)
		return err
	}
	// The router's LAN: 10.(a+64).(i/250).(i%250) is not enough room for a
	// /24 each, so each NATed node gets 10.(a+64).k.0/24 with k its rank.
	lanBase := n.lan.Addr().As4()
	k := n.natRank(h)
	if k > 253 {
		return fmt.Errorf("netns: at most 254 NATed nodes")
	}
	lanBase[2] = byte(k + 1)
	gw, node := lanBase, lanBase
	gw[3], node[3] = 1, 2
	h.IP = netip.AddrFrom4(node)
	lanNet := netip.PrefixFrom(netip.AddrFrom4(lanBase), 24).Masked()
	h.lanVeth, h.nodeVeth = fmt.Sprintf("p%sl%d", n.ID, i), "eth0"
	tmpNode := fmt.Sprintf("p%sy%d", n.ID, i)
	for _, c := range [][]string{
		{"link", "add", h.lanVeth, "type", "veth", "peer", "name", tmpNode},
		{"link", "set", h.lanVeth, "netns", h.Router},
		{"link", "set", tmpNode, "netns", h.NS},
	} {
		if err := ipc(c...); err != nil {
			return fmt.Errorf("netns: host %d: %w", i, err)
		}
	}
	for _, c := range []struct {
		ns   string
		args []string
	}{
		{h.Router, []string{"link", "set", h.lanVeth, "name", "lan"}},
		{h.Router, []string{"addr", "add", netip.AddrFrom4(gw).String() + "/24", "dev", "lan"}},
		{h.Router, []string{"link", "set", "lan", "up"}},
		{h.NS, []string{"link", "set", "lo", "up"}},
		{h.NS, []string{"link", "set", tmpNode, "name", "eth0"}},
		{h.NS, []string{"addr", "add", h.IP.String() + "/24", "dev", "eth0"}},
		{h.NS, []string{"link", "set", "eth0", "up"}},
		{h.NS, []string{"route", "add", "default", "via", netip.AddrFrom4(gw).String()}},
	} {
		if err := inNS(c.ns, c.args...); err != nil {
			return fmt.Errorf("netns: host %d: %w", i, err)
		}
	}
	h.lanVeth = "lan"
	if _, err := run(ctx, "ip", "netns", "exec", h.Router, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"); err != nil {
		return fmt.Errorf("netns: router %d: %w", i, err)
	}
	if err := nftIn(ctx, h.Router, natRules(n.HostIP, httpPort)); err != nil {
		return fmt.Errorf("netns: router %d: %w", i, err)
	}
	// The parent's route to the LAN, through the router's bridge address.
	if err := ipc("route", "add", lanNet.String(), "via", wan.String(), "dev", n.Bridge); err != nil {
		return fmt.Errorf("netns: host %d: %w", i, err)
	}
	return nil
}

// natRules is a NAT router's nftables ruleset: masquerade what leaves
// on the WAN leg, forward what the LAN asked for, and let in unasked only
// TCP from the parent (hostIP) to the node's httpPort.
func natRules(hostIP netip.Addr, httpPort int) string {
	return fmt.Sprintf(`table ip pspnat {
	chain masq {
		type nat hook postrouting priority srcnat; policy accept;
		oifname "wan" masquerade
	}
	chain guard {
		type filter hook forward priority filter; policy drop;
		ct state established,related accept
		iifname "lan" oifname "wan" accept
		iifname "wan" ip saddr %s tcp dport %d accept
	}
	# Unasked packets to the router itself (a peer's hole punch arriving
	# before the node's own packet opened the mapping) are dropped, as a
	# home router does. Left to the router's stack, TCP would answer with
	# a RST that aborts the node's simultaneous open, and UDP would leave
	# a conntrack entry that makes the masquerade of the node's own packet
	# to that peer move off port 4001: every punch failed.
	chain wanin {
		type filter hook input priority filter; policy accept;
		iifname "wan" ct state != established,related drop
	}
}
`, hostIP, httpPort)
}

// natRank is how many NATed hosts were added before h.
func (n *Net) natRank(h *Host) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	k := 0
	for _, o := range n.hosts {
		if o == h {
			break
		}
		if o.NATed {
			k++
		}
	}
	return k
}

// nftIn loads an nft ruleset into namespace ns.
func nftIn(ctx context.Context, ns, rules string) error {
	ctx, cancel := context.WithTimeout(ctx, cmdTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", ns, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("nft -f: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Limit caps host h's traffic to rate bytes per second each way with tc
// tbf: its uplink on the node's own veth end, its downlink on the other
// end (the bridge side, or the router's LAN leg when NATed; for a linked
// host, eth0's ingress through an ifb device).
func (n *Net) Limit(ctx context.Context, h *Host, rate float64) error {
	bits := strconv.FormatInt(int64(rate*8), 10) + "bit"
	// Burst: at least 10 ms at the rate, and enough for a 64 KiB GSO frame.
	burst := strconv.FormatInt(max(int64(rate/100), 64<<10+2048), 10)
	tbf := []string{"qdisc", "replace", "dev", "", "root", "tbf", "rate", bits, "burst", burst, "latency", "100ms"}
	set := func(ns, dev string) error {
		args := append([]string{}, tbf...)
		args[3] = dev
		if ns != "" {
			args = append([]string{"-n", ns}, args...)
		}
		_, err := run(ctx, "tc", args...)
		return err
	}
	if err := set(h.NS, h.nodeVeth); err != nil {
		return fmt.Errorf("netns: uplink limit of node %d: %w", h.Index, err)
	}
	var err error
	if h.linked {
		err = limitIngress(ctx, h, tbf)
	} else if h.NATed {
		err = set(h.Router, h.lanVeth)
	} else {
		err = set("", h.hostVeth)
	}
	if err != nil {
		return fmt.Errorf("netns: downlink limit of node %d: %w", h.Index, err)
	}
	return nil
}

// Close removes the namespaces (with their links, addresses, qdiscs and
// nftables tables), the bridge (with its routes) and the cgroups. The
// processes in the namespaces must have ended: a namespace that still
// holds one is reported. It is safe to call more than once.
func (n *Net) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	hosts, cg, neigh, sw := n.hosts, n.cgroups, n.neigh, n.sw
	n.mu.Unlock()
	if neigh != nil {
		defer neigh.restore()
	}
	if sw != nil {
		sw.close() // the linked hosts' TAPs go with it
	}
	ctx := context.Background()
	var errs []error
	for _, h := range hosts {
		for _, ns := range []string{h.NS, h.Router} {
			if ns == "" {
				continue
			}
			if err := delNS(ctx, ns); err != nil {
				errs = append(errs, err)
			}
		}
		// A veth whose peer never reached a namespace stays in the host's.
		_ = delLinkIfAny(ctx, h.hostVeth)
	}
	if err := delLinkIfAny(ctx, n.Bridge); err != nil {
		errs = append(errs, err)
	}
	if cg != nil {
		if err := cg.remove(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// delNS kills what still runs in ns, then deletes it (a missing one is
// fine).
func delNS(ctx context.Context, ns string) error {
	if !nsExists(ctx, ns) {
		return nil
	}
	if out, err := run(ctx, "ip", "netns", "pids", ns); err == nil {
		for _, f := range strings.Fields(out) {
			if pid, err := strconv.Atoi(f); err == nil {
				if p, err := os.FindProcess(pid); err == nil {
					_ = p.Kill()
				}
			}
		}
	}
	if _, err := run(ctx, "ip", "netns", "del", ns); err != nil {
		return err
	}
	return nil
}

func nsExists(ctx context.Context, ns string) bool {
	names, err := Namespaces(ctx)
	if err != nil {
		return true
	}
	for _, x := range names {
		if x == ns {
			return true
		}
	}
	return false
}

func delLinkIfAny(ctx context.Context, name string) error {
	if name == "" {
		return nil
	}
	if _, err := run(ctx, "ip", "link", "show", name); err != nil {
		return nil // gone already
	}
	_, err := run(ctx, "ip", "link", "del", name)
	return err
}

// Namespaces lists the network namespaces this package made (any run's).
func Namespaces(ctx context.Context) ([]string, error) {
	out, err := run(ctx, "ip", "netns", "list")
	if err != nil {
		return nil, err
	}
	var names []string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && strings.HasPrefix(f[0], Prefix) {
			names = append(names, f[0])
		}
	}
	return names, nil
}

// Command returns a command that runs name with args inside host h's
// namespace (ip netns exec replaces itself with the program, so the
// process is the program's).
func (h *Host) Command(name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", h.NS, name}, args...)...)
}
