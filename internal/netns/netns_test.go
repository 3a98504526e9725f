package netns

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

func needTools(t *testing.T) {
	t.Helper()
	if err := Check(true); err != nil {
		t.Fatalf("%v (CI runs as root after .ci/run installs iproute2 and nftables)", err)
	}
}

// dialFrom connects from inside namespace ns to addr with bash's /dev/tcp
// and sends one line.
func dialFrom(ctx context.Context, ns string, addr netip.AddrPort) error {
	_, err := run(ctx, "ip", "netns", "exec", ns, "timeout", "3", "bash", "-c",
		"echo hello > /dev/tcp/"+addr.Addr().String()+"/"+strconv.Itoa(int(addr.Port())))
	return err
}

// TestNetnsTopology builds a bridge with one public and one NATed host,
// checks that both reach the parent (the NATed one from its router's
// address: masqueraded), that the public host cannot reach the NATed one
// and that its router drops such dials silently, that rate limits and CPU cgroups apply, and that Close leaves nothing.
func TestNetnsTopology(t *testing.T) {
	needTools(t)
	for _, o := range []Options{{}, {PublicWAN: true}} {
		t.Run(fmt.Sprintf("public_wan=%v", o.PublicWAN), func(t *testing.T) { testTopology(t, o) })
	}
}

func testTopology(t *testing.T, o Options) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n, err := New(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if got := n.Subnet().Addr().As4()[0]; got != o.wanOctet() || n.lan.Addr().As4()[0] != 10 {
		t.Errorf("bridge %s, NAT LANs %s: want the bridge in %d.0.0.0/8 and the LANs in 10.0.0.0/8", n.Subnet(), n.lan, o.wanOctet())
	}
	closed := false
	defer func() {
		if !closed {
			_ = n.Close()
		}
	}()
	ln, err := net.Listen("tcp", n.HostIP.String()+":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	pub, err := n.AddHost(ctx, 0, false, 9090)
	if err != nil {
		t.Fatal(err)
	}
	priv, err := n.AddHost(ctx, 1, true, 9090)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Limit(ctx, pub, 1e6); err != nil {
		t.Fatal(err)
	}
	if err := n.Limit(ctx, priv, 1e6); err != nil {
		t.Fatal(err)
	}
	if out, _ := run(ctx, "tc", "-n", pub.NS, "qdisc", "show", "dev", "eth0"); !strings.Contains(out, "tbf") {
		t.Errorf("no tbf on the public node's uplink: %q", out)
	}
	accepted := make(chan string, 2)
	go func() { // ends when ln closes
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c.RemoteAddr().(*net.TCPAddr).IP.String()
			c.Close()
		}
	}()
	hostAddr := netip.AddrPortFrom(n.HostIP, uint16(port))
	for _, h := range []*Host{pub, priv} {
		if err := dialFrom(ctx, h.NS, hostAddr); err != nil {
			t.Fatalf("node %d cannot reach the parent: %v", h.Index, err)
		}
		select {
		case from := <-accepted:
			if from != h.PublicIP.String() {
				t.Errorf("node %d (own address %s) reached the parent from %s, want %s", h.Index, h.IP, from, h.PublicIP)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("node %d: no connection arrived", h.Index)
		}
	}
	if priv.IP == priv.PublicIP {
		t.Errorf("NATed node has its public address %s", priv.IP)
	}
	// Nothing listens there; a route would give "connection refused", a
	// missing one "network unreachable" or a timeout. Either way it fails,
	// and the error must not be a refusal from the node.
	err = dialFrom(ctx, pub.NS, netip.AddrPortFrom(priv.IP, 4001))
	if err == nil || strings.Contains(err.Error(), "refused") {
		t.Errorf("the public node reached the NATed node's private address: %v", err)
	}
	// The router drops unasked packets silently, as a home router does: a
	// refusal (a RST from its own stack) would abort the other side of a
	// hole punch's simultaneous open.
	err = dialFrom(ctx, pub.NS, netip.AddrPortFrom(priv.PublicIP, 4001))
	if err == nil || strings.Contains(strings.ToLower(err.Error()), "refused") {
		t.Errorf("a dial to the NATed node's router was not dropped: %v", err)
	}
	// CPU quota on a process of our own making.
	sleeper := pub.Command("sleep", "30")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	if err := n.LimitCPU(pub, sleeper.Process.Pid, 0.5); err != nil {
		t.Fatal(err)
	}
	cg, _ := os.ReadFile("/proc/" + strconv.Itoa(sleeper.Process.Pid) + "/cgroup")
	if !strings.Contains(string(cg), Prefix+n.ID) {
		t.Errorf("sleeper not in the run's cgroup:\n%s", cg)
	}
	_ = sleeper.Process.Kill()
	_ = sleeper.Wait()
	dir := n.CgroupDir()
	closed = true
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	assertGone(t, n.ID, dir)
}

// TestNeighbourLimits: two runs that raise the neighbour table's limits
// and close in either order leave them as they found them (on copies of
// the kernel's files: other tests' runs change the real ones meanwhile).
func TestNeighbourLimits(t *testing.T) {
	dir := t.TempDir() + "/"
	saved := neighDir
	neighDir = dir
	defer func() { neighDir = saved }()
	for f, v := range map[string]string{"gc_thresh2": "512\n", "gc_thresh3": "1024\n"} {
		if err := os.WriteFile(dir+f, []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	a, b := &Net{}, &Net{}
	if err := a.RaiseNeighbourLimits(100); err != nil {
		t.Fatal(err)
	}
	if err := b.RaiseNeighbourLimits(2550); err != nil {
		t.Fatal(err)
	}
	if v, _ := readInt("gc_thresh3"); v != 1024+100+2550 {
		t.Errorf("gc_thresh3 %d, want %d", v, 1024+100+2550)
	}
	a.neigh.restore()
	if l := parseNeigh("pspnode pid=7 neigh=2550/1912"); l == nil || *l != *b.neigh {
		t.Fatalf("alias parsed as %+v, want %+v", l, b.neigh)
	}
	parseNeigh("pspnode pid=7 neigh=2550/1912").restore() // as Sweep would
	v2, _ := readInt("gc_thresh2")
	v3, _ := readInt("gc_thresh3")
	if v2 != 512 || v3 != 1024 {
		t.Errorf("after both runs: gc_thresh2 %d, gc_thresh3 %d; want 512 and 1024", v2, v3)
	}
}

// assertGone checks that nothing named after run id remains.
func assertGone(t *testing.T, id, cgroupDir string) {
	t.Helper()
	ctx := context.Background()
	names, err := Namespaces(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range names {
		if strings.Contains(ns, id) {
			t.Errorf("namespace %s remains", ns)
		}
	}
	links, _ := run(ctx, "ip", "-o", "link", "show")
	if strings.Contains(links, "p"+id) {
		t.Errorf("links of run %s remain:\n%s", id, links)
	}
	if cgroupDir != "" {
		if _, err := os.Stat(cgroupDir); err == nil {
			t.Errorf("cgroup %s remains", cgroupDir)
		}
	}
}

// TestNetnsSweep: a run whose owner is gone (here: a bridge whose alias
// names no live process) is swept, a linked host's namespace with it; the
// sweep leaves a live run alone.
func TestNetnsSweep(t *testing.T) {
	needTools(t)
	needLinkTools(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	live, err := New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	if _, err := live.AddHost(ctx, 0, false, 9090); err != nil {
		t.Fatal(err)
	}
	dead, err := New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()
	if _, err := dead.AddHost(ctx, 0, true, 9090); err != nil {
		t.Fatal(err)
	}
	// A linked host's namespace goes too.
	if _, err := dead.AddLinkedHost(ctx, 1, Link{Delay: time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	// pid 0x3fffffff does not exist (above pid_max).
	if _, err := run(ctx, "ip", "link", "set", dead.Bridge, "alias", "pspnode pid=1073741823"); err != nil {
		t.Fatal(err)
	}
	swept, err := Sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(swept, " "), dead.ID) || strings.Contains(strings.Join(swept, " "), live.ID) {
		t.Errorf("swept %v; want %s and not %s", swept, dead.ID, live.ID)
	}
	assertGone(t, dead.ID, "")
	if names, _ := Namespaces(ctx); !strings.Contains(strings.Join(names, " "), live.ID) {
		t.Errorf("the live run's namespace was swept: %v", names)
	}
}

// TestNetnsRateLimit: 3 MB sent from a node limited to 1 MB/s all reach
// the parent, through the node's token bucket, which held them back: its
// counters show the bytes it sent and that it was over its rate (tbf's
// overlimits), where an unlimited link would not be. Counted, not timed.
func TestNetnsRateLimit(t *testing.T) {
	needTools(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n, err := New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	h, err := n.AddHost(ctx, 0, false, 9090)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Limit(ctx, h, 1e6); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", n.HostIP.String()+":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan int64, 1)
	go func() { // ends when the sender closes its connection, or ln closes
		c, err := ln.Accept()
		if err != nil {
			got <- -1
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		var total int64
		buf := make([]byte, 64<<10)
		for {
			k, err := c.Read(buf)
			total += int64(k)
			if err != nil {
				got <- total
				return
			}
		}
	}()
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	if _, err := run(ctx, "ip", "netns", "exec", h.NS, "timeout", "30", "bash", "-c",
		"head -c 3000000 /dev/zero > /dev/tcp/"+n.HostIP.String()+"/"+port); err != nil {
		t.Fatal(err)
	}
	var total int64
	select {
	case total = <-got:
	case <-time.After(40 * time.Second):
		t.Fatal("the transfer did not end")
	}
	if total != 3000000 {
		t.Errorf("%d bytes through a 1 MB/s limit; want 3000000", total)
	}
	stats, err := run(ctx, "tc", "-s", "-n", h.NS, "qdisc", "show", "dev", h.nodeVeth)
	if err != nil {
		t.Fatal(err)
	}
	sent, over := tbfCounter(stats, "Sent "), tbfCounter(stats, "overlimits ")
	if !strings.Contains(stats, "tbf") || sent < 3000000 || over == 0 {
		t.Errorf("the uplink's token bucket sent %d bytes, over its rate %d times; want at least 3000000 and some:\n%s", sent, over, stats)
	}
}

// tbfCounter is the number after label in tc's statistics (-1: none).
func tbfCounter(stats, label string) int64 {
	_, rest, ok := strings.Cut(stats, label)
	if !ok {
		return -1
	}
	v, err := strconv.ParseInt(strings.Fields(rest)[0], 10, 64)
	if err != nil {
		return -1
	}
	return v
}
