package netns

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Sweep removes what runs whose owning process is gone left behind:
// their namespaces (and the processes in them), bridges, stray veths and
// cgroups. (The TAPs of linked hosts went with the owner's process.) It returns the run IDs it removed. Runs whose owner is alive
// are left alone.
func Sweep(ctx context.Context) ([]string, error) {
	runs := map[string]bool{}
	names, err := Namespaces(ctx)
	if err != nil {
		return nil, err
	}
	for _, ns := range names {
		if id, _, ok := strings.Cut(strings.TrimPrefix(ns, Prefix), "-"); ok {
			runs[id] = true
		}
	}
	links, err := run(ctx, "ip", "-o", "link", "show")
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Split(links, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
		if len(name) == 9 && strings.HasPrefix(name, "p") && strings.HasSuffix(name, "br") {
			runs[name[1:7]] = true
		}
	}
	if dir, _, err := cpuHierarchy(); err == nil {
		ds, _ := filepath.Glob(filepath.Join(dir, Prefix+"*"))
		for _, d := range ds {
			runs[strings.TrimPrefix(filepath.Base(d), Prefix)] = true
		}
	}
	var swept []string
	var errs []error
	for id := range runs {
		if ownerAlive(ctx, id) {
			continue
		}
		if out, err := run(ctx, "ip", "-o", "link", "show", "p"+id+"br"); err == nil {
			if l := parseNeigh(out); l != nil {
				l.restore()
			}
		}
		if err := sweepRun(ctx, id, names, links); err != nil {
			errs = append(errs, err)
		}
		swept = append(swept, id)
	}
	return swept, errors.Join(errs...)
}

// ownerAlive reads the owner pid from run id's bridge alias and says
// whether that process still runs. A run without a bridge has no owner.
func ownerAlive(ctx context.Context, id string) bool {
	out, err := run(ctx, "ip", "-o", "link", "show", "p"+id+"br")
	if err != nil {
		return false
	}
	_, rest, ok := strings.Cut(out, "alias pspnode pid=")
	if !ok {
		return false
	}
	pid, err := strconv.Atoi(strings.Fields(rest)[0])
	if err != nil || pid <= 0 {
		return false
	}
	p, err := os.FindProcess(pid)
	return err == nil && p.Signal(syscall.Signal(0)) == nil
}

func sweepRun(ctx context.Context, id string, names []string, links string) error {
	var errs []error
	for _, ns := range names {
		if strings.HasPrefix(ns, Prefix+id+"-") {
			if err := delNS(ctx, ns); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for _, line := range strings.Split(links, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
		if strings.HasPrefix(name, "p"+id) {
			if err := delLinkIfAny(ctx, name); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if dir, v2, err := cpuHierarchy(); err == nil {
		d := filepath.Join(dir, Prefix+id)
		if _, err := os.Stat(d); err == nil {
			if err := (&cgroups{dir: d, v2: v2}).remove(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}
