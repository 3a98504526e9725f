package trainer

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/pspnode/pspnode/internal/procstat"
	"github.com/pspnode/pspnode/node"
	"github.com/pspnode/pspnode/node/exchange"
)

// BenchmarkStepCall is the daemon's side of a trainer's step for a model
// of 1 M float32 parameters, through shared memory: two daemons on
// loopback, the measured trainer and a peer stepping alike, so every Step
// call publishes an update, passes a barrier that does not wait, and pulls
// the peer's update. Between calls each trainer "computes" for 30 ms, as a
// trainer would, while the daemon sends the last update. Reported:
// p50-ms and p90-ms of the Step call as the trainer sees it.
func BenchmarkStepCall(b *testing.B) {
	if !sharedMemorySupported {
		b.Skip("no shared memory")
	}
	const n = 1_000_000
	a := startDaemon(b, "bench", nil, "pssp:1:4", nil)
	p := startDaemon(b, "bench", a, "pssp:1:4", nil)
	peersKnow(b, a, p)
	ta, err := connectShm(b, a.addr, hello("big", 9, n, 0), true)
	if err != nil {
		b.Fatal(err)
	}
	tp, err := connectShm(b, p.addr, hello("big", 9, n, 0), true)
	if err != nil {
		b.Fatal(err)
	}
	delta := fill(n, 1e-4)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop := make(chan struct{})
	go func() { // the peer
		for s := int64(1); ; s++ {
			select {
			case <-stop:
				return
			case <-time.After(30 * time.Millisecond):
			}
			if _, err := tp.stepShm(ctx, s, delta); err != nil {
				return
			}
		}
	}()
	defer close(stop)
	var lat []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		time.Sleep(30 * time.Millisecond)
		b.StartTimer()
		t := time.Now()
		if _, err := ta.stepShm(ctx, int64(i+1), delta); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t))
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1e3, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*9/10].Microseconds())/1e3, "p90-ms")
}

// BenchmarkDaemonCPU is what a daemon spends per step of its trainer, for
// the MNIST example's model (101 770 parameters): N daemons in this
// process, each driven by a trainer stepping as fast as its barrier (ASP)
// lets it, through shared memory. Reported: CPU-ms per step per daemon
// (the whole process's CPU over all daemons' steps), and the steps per
// second of one daemon.
func BenchmarkDaemonCPU(b *testing.B) {
	if !sharedMemorySupported {
		b.Skip("no shared memory")
	}
	for _, xspec := range []string{"epidemic:4", "gossip", "epidemic:2"} {
		for _, n := range []int{4, 8} {
			b.Run(fmt.Sprintf("%s/N=%d", xspec, n), func(b *testing.B) {
				const params = 101770
				ex, err := exchange.Parse(xspec)
				if err != nil {
					b.Fatal(err)
				}
				edit := func(c *node.Config, _ *Config) { c.Exchange.Spec = ex }
				ds := []*daemon{startDaemon(b, "cpu", nil, "asp", edit)}
				for i := 1; i < n; i++ {
					ds = append(ds, startDaemon(b, "cpu", ds[0], "asp", edit))
				}
				peersKnow(b, ds...)
				trs := make([]*trainer, n)
				for i, d := range ds {
					if trs[i], err = connectShm(b, d.addr, hello("mlp", 3, params, 0), true); err != nil {
						b.Fatal(err)
					}
				}
				delta := fill(params, 1e-4)
				ctx := context.Background()
				steps := b.N
				cpu0 := procstat.CPUTime()
				start := time.Now()
				b.ResetTimer()
				var wg sync.WaitGroup
				for _, tr := range trs {
					wg.Go(func() {
						for s := int64(1); s <= int64(steps); s++ {
							if _, err := tr.stepShm(ctx, s, delta); err != nil {
								b.Error(err)
								return
							}
						}
					})
				}
				wg.Wait()
				b.StopTimer()
				cpu := procstat.CPUTime() - cpu0
				b.ReportMetric(float64(cpu.Microseconds())/1e3/float64(n*steps), "CPU-ms/step")
				b.ReportMetric(float64(steps)/time.Since(start).Seconds(), "steps/s")
			})
		}
	}
}
