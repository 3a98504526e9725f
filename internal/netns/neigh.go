package netns

import (
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
// limits while it runs, and puts back the values it found on Close.
const neighDir = "/proc/sys/net/ipv4/neigh/default/"

// neighLimits is the gc_thresh2 and gc_thresh3 a Net found and set.
type neighLimits struct {
	old2, old3 int
	set2, set3 int
}

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

// RaiseNeighbourLimits makes room in the neighbour table for entries more
// entries than it allows now (nothing if it has room), until Close.
func (n *Net) RaiseNeighbourLimits(entries int) error {
	old2, err2 := readInt("gc_thresh2")
	old3, err3 := readInt("gc_thresh3")
	if err2 != nil || err3 != nil {
		return fmt.Errorf("netns: neighbour table limits: %v %v", err2, err3)
	}
	want3 := old3 + entries
	want2 := max(old2, want3*3/4)
	if err := writeInt("gc_thresh3", want3); err != nil {
		return fmt.Errorf("netns: neighbour table limit: %w", err)
	}
	if err := writeInt("gc_thresh2", want2); err != nil {
		_ = writeInt("gc_thresh3", old3)
		return fmt.Errorf("netns: neighbour table limit: %w", err)
	}
	n.mu.Lock()
	n.neigh = &neighLimits{old2: old2, old3: old3, set2: want2, set3: want3}
	n.mu.Unlock()
	return nil
}

// restore puts back the limits found, unless something else has changed
// them since (another run that raised them further restores its own).
func (l *neighLimits) restore() {
	if v, err := readInt("gc_thresh3"); err == nil && v == l.set3 {
		_ = writeInt("gc_thresh3", l.old3)
	}
	if v, err := readInt("gc_thresh2"); err == nil && v == l.set2 {
		_ = writeInt("gc_thresh2", l.old2)
	}
}
