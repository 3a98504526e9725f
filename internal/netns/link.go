package netns

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// Emulated wide-area links.
//
// A kernel without the netem qdisc cannot delay packets, so a host added
// with AddLinkedHost is not on the bridge: its only interface, eth0, is a
// TAP device whose frames a switch in this process carries (switch.go).
// The switch reads each frame from its source's TAP, learns where
// addresses are as an Ethernet switch does, and writes the frame to its
// destination's TAP (to every other one for a broadcast) once the source
// link's delay and the destination link's have passed. With every link at
// delay d, the one-way delay between two hosts is 2d and the TCP round
// trip 4d, plus what forwarding takes (tens of microseconds). The TAPs
// carry the kernel's segmentation offloads (virtio-net headers), so a TCP
// burst crosses the switch as one read and one write of up to 64 KiB, not
// one per 1500-byte frame. The rate is the kernel's: a tbf qdisc on the
// host's uplink (eth0) and one on its downlink (eth0's ingress redirected
// to an ifb device), so each host has an access link of that rate each
// way, as published emulations give each machine (tc netem delay and
// rate on each machine).
//
// What this cannot do: the switch's work (a read and a write per frame,
// about 10 µs of CPU each way) is done by this process on the cores the
// hosts' processes use; a frame waits for the Go scheduler, so under load
// the delay grows by the scheduling latency (a fraction of a millisecond
// on 2 busy cores); there is no jitter, loss or reordering; a frame's
// delay does not depend on its size beyond what tbf imposes; queues beyond
// the tbf ones (100 ms deep) are the switch's, capped at 64 MiB per
// destination, beyond which frames are dropped and counted.

// Link is what a linked host's access link does to its traffic.
type Link struct {
	// Delay is added to every frame crossing the link, in each direction.
	// Between two hosts with Delay d each, the round trip is 4d.
	Delay time.Duration
	// Rate caps the host's traffic each way, in bytes per second (0:
	// none).
	Rate float64
}

// CheckLinks reports what is missing to add linked hosts: what Check
// needs, and /dev/net/tun (TAP devices). The error names each.
func CheckLinks() error {
	if err := Check(false); err != nil {
		return err
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		return errors.New("emulated links need /dev/net/tun (TAP devices: the kernel's tun module)")
	}
	return nil
}

// LinkCounters is what a run's switch has carried.
type LinkCounters struct {
	Frames, Bytes int64
	// Dropped counts frames dropped at a full queue, Errors failed reads
	// and writes on the TAPs.
	Dropped, Errors int64
	// CPU is the switch's thread's CPU time, the receiving kernels' work
	// in its writes to the TAPs included.
	CPU time.Duration
}

// LinkCounters is what the run's switch has carried so far (zero without
// linked hosts).
func (n *Net) LinkCounters() LinkCounters {
	n.mu.Lock()
	sw := n.sw
	n.mu.Unlock()
	if sw == nil {
		return LinkCounters{}
	}
	return sw.counters()
}

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
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil, errors.New("netns: closed")
	}
	if n.sw == nil {
		sw, err := newSwitch()
		if err != nil {
			n.mu.Unlock()
			return nil, err
		}
		n.sw = sw
	}
	sw := n.sw
	h := &Host{Index: i, NS: fmt.Sprintf("%s%s-n%d", Prefix, n.ID, i), linked: true}
	n.hosts = append(n.hosts, h)
	n.mu.Unlock()
	if _, err := run(ctx, "ip", "netns", "add", h.NS); err != nil {
		return nil, fmt.Errorf("netns: %w", err)
	}
	h.nodeVeth = "eth0"
	var tap *tapDevice
	if err := h.Do(func() error {
		var err error
		tap, err = openTap(h.nodeVeth)
		return err
	}); err != nil {
		return nil, fmt.Errorf("netns: linked host %d: %w", i, err)
	}
	if err := sw.attach(tap, l.Delay); err != nil {
		return nil, err
	}
	h.IP = addrOf(n.subnet, i)
	h.PublicIP = h.IP
	for _, args := range [][]string{
		{"link", "set", "lo", "up"},
		{"addr", "add", h.IP.String() + "/16", "dev", h.nodeVeth},
		{"link", "set", h.nodeVeth, "up"},
	} {
		if _, err := run(ctx, "ip", append([]string{"-n", h.NS}, args...)...); err != nil {
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
