package testnet

import (
	"testing"
	"time"

	"github.com/pspnode/pspnode/internal/procstat"
)

// A run reports its own CPU, not the process's: the second of two runs in
// one process (a command with several barriers) costs no more than the
// CPU the process spent while it ran.
func TestCostIsTheRunsOwn(t *testing.T) {
	cfg := tinyConfig(8, 5*time.Second)
	runLogged(t, cfg)
	before := procstat.CPUTime()
	res := runLogged(t, cfg)
	spent := (procstat.CPUTime() - before).Seconds()
	if !(res.CPUS > 0) || res.CPUS > spent || res.Cost.CPUS != res.CPUS {
		t.Errorf("the second run reports %.3f CPU-seconds (cost %.3f); the process spent %.3f while it ran", res.CPUS, res.Cost.CPUS, spent)
	}
}
