package netns

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Emulated wide-area links.
//
// A kernel without the netem qdisc cannot delay packets, so a host added
// with AddLinkedHost is not on the bridge: its only interface, eth0, is a
// TAP device whose frames a user-space forwarder carries. The forwarders
// are Virtual Distributed Ethernet's (Debian's vde2): one vde_switch per
// host holds the host's TAP, a wirefilter joins that switch to a hub
// switch shared by the run and delays every frame crossing it, each way.
// A frame from host A to host B crosses A's wirefilter and B's, so with
// every link at delay d the one-way delay is 2d and the TCP round trip 4d,
// plus what forwarding itself takes (about 0.1 ms here). The rate is the
// kernel's: a tbf qdisc on the host's uplink (eth0) and one on its
// downlink (eth0's ingress redirected to an ifb device), so each host has
// an access link of that rate each way, as published emulations give each
// machine (tc netem delay and rate per machine).
//
// The forwarders run in a namespace of the run's own (pspnode-ID-vde),
// where their TAP devices are made before moving to the hosts, so that
// Close and Sweep end them with it. They read commands on stdin and quit
// when it closes: the Net holds each one's stdin open until Close.
//
// What this cannot do: every frame is copied through five user-space
// processes (switch, wirefilter, hub, wirefilter, switch), which costs CPU
// the training processes share (about 13 CPU-ms per MB carried here) and
// tops out near 1 Gbit/s; wirefilter keeps delays to about a millisecond
// of resolution, adds no jitter unless asked, and queues without limit
// (the tbf queues, 100 ms deep, are the bottlenecks); there is no loss
// and no reordering.

// Link is what a linked host's access link does to its traffic.
type Link struct {
	// Delay is added to every frame crossing the link, in each direction
	// (wirefilter -d, in milliseconds; resolution about 1 ms). Between
	// two hosts with Delay d each, the round trip is 4d.
	Delay time.Duration
	// Rate caps the host's traffic each way, in bytes per second (0:
	// none).
	Rate float64
}

// CheckLinks reports what is missing to add linked hosts: what Check
// needs, the vde2 tools, and /dev/net/tun. The error names each.
func CheckLinks() error {
	if err := Check(false); err != nil {
		return err
	}
	var missing []string
	for _, t := range []struct{ bin, pkg string }{{"vde_switch", "vde2 (vde-switch)"}, {"wirefilter", "vde2 (vde-wirefilter)"}} {
		if _, err := exec.LookPath(t.bin); err != nil {
			missing = append(missing, fmt.Sprintf("%s (Debian package %s)", t.bin, t.pkg))
		}
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		missing = append(missing, "/dev/net/tun (TAP devices: the tun module)")
	}
	if len(missing) > 0 {
		return fmt.Errorf("emulated links need %s", strings.Join(missing, ", "))
	}
	return nil
}

// star is a run's forwarders: a hub switch, and per linked host a switch
// holding its TAP and a wirefilter to the hub.
type star struct {
	ns  string // the namespace they run in
	dir string // their sockets
	mu  sync.Mutex
	fw  []*forwarder
}

// forwarder is one vde process.
type forwarder struct {
	name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser // held open: vde tools quit when stdin closes
	out   *tail
	done  chan struct{} // closed once reaped
}

// tail keeps the last 2 KiB written to it.
type tail struct {
	mu  sync.Mutex
	buf []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > 2048 {
		t.buf = t.buf[len(t.buf)-2048:]
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(string(t.buf))
}

// sockDir is where run id's forwarders keep their sockets.
func sockDir(id string) string { return filepath.Join(os.TempDir(), Prefix+id+"-vde") }

// starOf returns the run's star, making its namespace and hub on first use.
func (n *Net) starOf(ctx context.Context) (*star, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil, errors.New("netns: closed")
	}
	if n.star != nil {
		return n.star, nil
	}
	s := &star{ns: Prefix + n.ID + "-vde", dir: sockDir(n.ID)}
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return nil, fmt.Errorf("netns: %w", err)
	}
	n.star = s // Close removes whatever part was made
	if _, err := run(ctx, "ip", "netns", "add", s.ns); err != nil {
		return nil, fmt.Errorf("netns: %w", err)
	}
	hub := filepath.Join(s.dir, "hub")
	if err := s.start(ctx, "hub", "vde_switch", "-s", hub, "-n", "256"); err != nil {
		return nil, err
	}
	if err := s.waitFor(ctx, "hub", filepath.Join(hub, "ctl")); err != nil {
		return nil, err
	}
	return s, nil
}

// start runs one forwarder in the star's namespace.
func (s *star) start(ctx context.Context, name, bin string, args ...string) error {
	f := &forwarder{name: name, out: &tail{}, done: make(chan struct{})}
	f.cmd = exec.Command("ip", append([]string{"netns", "exec", s.ns, bin}, args...)...)
	f.cmd.Stdout, f.cmd.Stderr = f.out, f.out
	f.cmd.SysProcAttr = childAttr()
	in, err := f.cmd.StdinPipe()
	if err != nil {
		return fmt.Errorf("netns: %s: %w", name, err)
	}
	f.stdin = in
	if err := f.cmd.Start(); err != nil {
		return fmt.Errorf("netns: %s: %w", name, err)
	}
	go func() { _ = f.cmd.Wait(); close(f.done) }() // ends when the process does
	s.mu.Lock()
	s.fw = append(s.fw, f)
	s.mu.Unlock()
	return nil
}

// waitFor waits until path exists (a switch's control socket), or the
// forwarder named ends, or 10 s pass.
func (s *star) waitFor(ctx context.Context, name, path string) error {
	f := s.find(name)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		select {
		case <-f.done:
			return fmt.Errorf("netns: %s ended at start: %s", name, f.out)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("netns: %s did not make %s in 10 s: %s", name, path, f.out)
		}
	}
}

func (s *star) find(name string) *forwarder {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range s.fw {
		if f.name == name {
			return f
		}
	}
	return nil
}

// stop closes every forwarder's stdin, waits a second for them to quit,
// kills those left, and returns their CPU seconds.
func (s *star) stop() (cpu float64) {
	s.mu.Lock()
	fws := s.fw
	s.fw = nil
	s.mu.Unlock()
	for _, f := range fws {
		_ = f.stdin.Close()
	}
	deadline := time.After(time.Second)
	for _, f := range fws {
		select {
		case <-f.done:
		case <-deadline:
			_ = f.cmd.Process.Kill()
			<-f.done
		}
		if st := f.cmd.ProcessState; st != nil {
			cpu += (st.UserTime() + st.SystemTime()).Seconds()
		}
	}
	return cpu
}

// ForwarderCPU is the CPU seconds the run's link forwarders have used so
// far (0 without linked hosts, or where /proc is missing).
func (n *Net) ForwarderCPU() float64 {
	n.mu.Lock()
	s := n.star
	n.mu.Unlock()
	if s == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var cpu float64
	for _, f := range s.fw {
		cpu += procCPU(f.cmd.Process.Pid)
	}
	return cpu
}

// procCPU is the user and system CPU seconds of process pid (/proc/PID/stat).
func procCPU(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name (field 2) may hold spaces; fields count from the
	// last ')'.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0
	}
	ut, err1 := strconv.ParseFloat(f[11], 64)
	st, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		return 0
	}
	return (ut + st) / clockTicks
}

// clockTicks is USER_HZ, 100 on every Linux architecture Go supports.
const clockTicks = 100

// AddLinkedHost makes host i's namespace with an emulated link l to the
// run's other linked hosts (not to the bridge, nor to the parent: reach
// it from the parent with Host.Dial). Its address is on the run's subnet.
func (n *Net) AddLinkedHost(ctx context.Context, i int, l Link) (*Host, error) {
	if runtime.GOOS != "linux" {
		return nil, errors.New("netns: emulated links need Linux")
	}
	if l.Delay < 0 || l.Rate < 0 {
		return nil, fmt.Errorf("netns: link %+v: want a delay and a rate >= 0", l)
	}
	s, err := n.starOf(ctx)
	if err != nil {
		return nil, err
	}
	n.mu.Lock()
	h := &Host{Index: i, NS: fmt.Sprintf("%s%s-n%d", Prefix, n.ID, i), linked: true}
	n.hosts = append(n.hosts, h)
	n.mu.Unlock()
	if _, err := run(ctx, "ip", "netns", "add", h.NS); err != nil {
		return nil, fmt.Errorf("netns: %w", err)
	}
	tap := fmt.Sprintf("p%st%d", n.ID, i)
	sw := filepath.Join(s.dir, fmt.Sprintf("s%d", i))
	name := fmt.Sprintf("switch %d", i)
	if err := s.start(ctx, name, "vde_switch", "-s", sw, "-n", "4", "-t", tap); err != nil {
		return nil, err
	}
	if err := s.waitFor(ctx, name, filepath.Join(sw, "ctl")); err != nil {
		return nil, err
	}
	args := []string{"-v", sw + ":" + filepath.Join(s.dir, "hub")}
	if l.Delay > 0 {
		args = append(args, "-d", strconv.FormatFloat(float64(l.Delay)/float64(time.Millisecond), 'f', -1, 64))
	}
	if err := s.start(ctx, fmt.Sprintf("wirefilter %d", i), "wirefilter", args...); err != nil {
		return nil, err
	}
	h.IP = addrOf(n.subnet, i)
	h.PublicIP, h.nodeVeth = h.IP, "eth0"
	for _, c := range []struct {
		ns   string
		args []string
	}{
		{s.ns, []string{"link", "set", tap, "netns", h.NS}},
		{h.NS, []string{"link", "set", "lo", "up"}},
		{h.NS, []string{"link", "set", tap, "name", "eth0"}},
		{h.NS, []string{"addr", "add", h.IP.String() + "/16", "dev", "eth0"}},
		{h.NS, []string{"link", "set", "eth0", "up"}},
	} {
		if _, err := run(ctx, "ip", append([]string{"-n", c.ns}, c.args...)...); err != nil {
			return nil, fmt.Errorf("netns: linked host %d: %w", i, err)
		}
	}
	if l.Rate > 0 {
		if err := n.Limit(ctx, h, l.Rate); err != nil {
			return nil, err
		}
	}
	return h, nil
}

// limitIngress caps what reaches linked host h: eth0's ingress goes
// through an ifb device whose egress has the tbf arguments tbf.
func limitIngress(ctx context.Context, h *Host, tbf []string) error {
	const ifb = "ifb0"
	for _, c := range [][]string{
		{"ip", "-n", h.NS, "link", "add", ifb, "type", "ifb"},
		{"ip", "-n", h.NS, "link", "set", ifb, "up"},
		{"tc", "-n", h.NS, "qdisc", "add", "dev", h.nodeVeth, "handle", "ffff:", "ingress"},
		{"tc", "-n", h.NS, "filter", "add", "dev", h.nodeVeth, "parent", "ffff:", "protocol", "all",
			"u32", "match", "u32", "0", "0", "action", "mirred", "egress", "redirect", "dev", ifb},
	} {
		if _, err := run(ctx, c[0], c[1:]...); err != nil {
			return err
		}
	}
	args := append([]string{"-n", h.NS}, tbf...)
	args[5] = ifb // tbf is "qdisc replace dev DEV ..."
	_, err := run(ctx, "tc", args...)
	return err
}

// TxBytes is what host h's eth0 has sent, in bytes (headers included).
func (h *Host) TxBytes(ctx context.Context) (int64, error) {
	out, err := run(ctx, "ip", "-n", h.NS, "-s", "-o", "link", "show", "dev", h.nodeVeth)
	if err != nil {
		return 0, err
	}
	return parseTxBytes(out)
}

// parseTxBytes reads the TX byte count from `ip -s -o link show`: the
// line holds "TX: bytes packets ...\    N M ...".
func parseTxBytes(out string) (int64, error) {
	_, rest, ok := strings.Cut(out, "TX:")
	if !ok {
		return 0, fmt.Errorf("netns: no TX counters in %q", out)
	}
	f := strings.Fields(strings.ReplaceAll(rest, `\`, " "))
	// Header words up to the first number.
	for _, w := range f {
		if v, err := strconv.ParseInt(w, 10, 64); err == nil {
			return v, nil
		}
	}
	return 0, fmt.Errorf("netns: no TX byte count in %q", out)
}
