package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// proc is a process of a run: a trainer or a daemon.
type proc struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{} // closed once reaped
	err  error         // set before done closes
}

func (p *proc) start() error {
	f, err := os.Create(p.log)
	if err != nil {
		return err
	}
	p.cmd.Stdout, p.cmd.Stderr = f, f
	p.cmd.SysProcAttr = childAttr()
	p.done = make(chan struct{})
	if err := p.cmd.Start(); err != nil {
		f.Close()
		return err
	}
	go func() { p.err = p.cmd.Wait(); f.Close(); close(p.done) }() // ends with the process
	return nil
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends sig, waits up to wait, then kills.
func (p *proc) stop(sig syscall.Signal, wait time.Duration) {
	if p == nil || p.cmd.Process == nil {
		return
	}
	if !p.exited() {
		_ = p.cmd.Process.Signal(sig)
	}
	select {
	case <-p.done:
	case <-time.After(wait):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func (p *proc) tail() string {
	b, _ := os.ReadFile(p.log)
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return strings.TrimSpace(string(b))
}

// usage is the CPU seconds and peak resident bytes of an ended process.
func usage(p *proc) (cpu float64, peak int64) {
	if p == nil || p.cmd.ProcessState == nil {
		return 0, 0
	}
	st := p.cmd.ProcessState
	cpu = (st.UserTime() + st.SystemTime()).Seconds()
	if ru, ok := st.SysUsage().(*syscall.Rusage); ok {
		peak = ru.Maxrss * 1024
	}
	return cpu, peak
}

// lineageOf is the "lineage" of a /status body ("" when absent).
func lineageOf(status string) string {
	var s struct {
		Lineage string `json:"lineage"`
	}
	_ = json.NewDecoder(bufio.NewReader(strings.NewReader(status))).Decode(&s)
	return s.Lineage
}

// settingsOf is the barrier and exchange of a /status body ("" when
// absent).
func settingsOf(status string) string {
	var s struct {
		Barrier  string `json:"barrier"`
		Exchange struct {
			Exchange string `json:"exchange"`
		} `json:"exchange"`
	}
	_ = json.NewDecoder(strings.NewReader(status)).Decode(&s)
	if s.Barrier == "" {
		return ""
	}
	if s.Exchange.Exchange == "" {
		return s.Barrier
	}
	return s.Barrier + ", " + s.Exchange.Exchange
}

// distinct counts the different non-empty lineages.
func distinct(ls []string) int {
	seen := map[string]bool{}
	for _, l := range ls {
		if l != "" {
			seen[l] = true
		}
	}
	return len(seen)
}

func humanBytes(b float64) string {
	switch {
	case b >= 1<<20:
		return fmt.Sprintf("%.2f MB", b/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.0f kB", b/(1<<10))
	}
	return fmt.Sprintf("%.0f B", b)
}
