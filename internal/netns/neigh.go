package netns

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// The kernel's IPv4 neighbour (ARP) table is one for every namespace, and
// its size limit, gc_thresh3 (1024 by default), counts the entries of all
// of them. N nodes on one bridge that all talk to each other hold about
// N² entries: at 50 nodes the table overflows, and new neighbours stay
// unresolved, so connections to them time out. A Net therefore raises the
// limits by what it needs while it runs, and lowers them by as much on
// Close: as additions and subtractions, concurrent runs leave the limits
// as they found them in any order. The bridge's alias records what was
// added, so that Sweep takes it back after a crash.
var neighDir = "/proc/sys/net/ipv4/neigh/default/" // a variable for tests

// neighLimits is what a Net added to gc_thresh2 and gc_thresh3.
type neighLimits struct{ add2, add3 int }

func readInt(file string) (int, error) {
	b, err := os.ReadFile(neighDir + file)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

func writeInt(file string, v int) error {
	return os.WriteFile(neighDir+file, []byte(strconv.Itoa(v)), 0)
}

// addInt adds d to a limit.
func addInt(file string, d int) error {
	v, err := readInt(file)
	if err != nil {
		return err
	}
	return writeInt(file, v+d)
}

// RaiseNeighbourLimits makes room in the neighbour table for entries more
// entries than it allows now, until Close.
func (n *Net) RaiseNeighbourLimits(entries int) error {
	l := &neighLimits{add2: entries * 3 / 4, add3: entries}
	if err := addInt("gc_thresh3", l.add3); err != nil {
		return fmt.Errorf("netns: neighbour table limit: %w", err)
	}
	if err := addInt("gc_thresh2", l.add2); err != nil {
		_ = addInt("gc_thresh3", -l.add3)
		return fmt.Errorf("netns: neighbour table limit: %w", err)
	}
	n.mu.Lock()
	n.neigh = l
	n.mu.Unlock()
	// Recorded beside the owner, for Sweep to take back after a crash.
	if n.Bridge != "" {
		_, _ = run(context.Background(), "ip", "link", "set", n.Bridge, "alias",
			fmt.Sprintf("pspnode pid=%d neigh=%d/%d", os.Getpid(), l.add3, l.add2))
	}
	return nil
}

// parseNeigh reads "neigh=A3/A2" from a bridge alias.
func parseNeigh(alias string) *neighLimits {
	_, rest, ok := strings.Cut(alias, "neigh=")
	if !ok {
		return nil
	}
	a3, a2, ok := strings.Cut(strings.Fields(rest)[0], "/")
	v3, err3 := strconv.Atoi(a3)
	v2, err2 := strconv.Atoi(a2)
	if !ok || err3 != nil || err2 != nil || v3 < 0 || v2 < 0 {
		return nil
	}
	return &neighLimits{add2: v2, add3: v3}
}

// restore takes back what was added.
func (l *neighLimits) restore() {
	_ = addInt("gc_thresh2", -l.add2)
	_ = addInt("gc_thresh3", -l.add3)
}
