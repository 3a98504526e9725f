package node

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pspnode/pspnode/internal/memnet"
)

// BenchmarkBarrierCheck measures barrier decisions of pSSP(10,4): one
// check is a draw of β = 10 peers from the sampler, their step queries in
// parallel (hedged and replaced as in a real run), and the decision. N
// nodes run in one process on the in-memory transport, with the overlay
// and GossipSub running; the nodes do not train, so what is measured is
// the check itself:
//
//   - idle: one check at a time, each from a different node in turn;
//   - polling (one 20-s pass, whatever -benchtime says): every node checks, waits 62 ms (the default poll cap for
//     the paper's 2-s steps, PollShare × 2 s) and checks again, for 20 s:
//     the load of a testnet in which every node waits at its barrier.
//
// Reported: p50-ms and p99-ms of the decision latency over all checks.
//
//	go test -run '^$' -bench '^BenchmarkBarrierCheck$' -benchtime 2000x -timeout 20m ./node/
func BenchmarkBarrierCheck(b *testing.B) {
	for _, n := range []int{50, 200} {
		b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) {
			mn := memnet.New(0)
			b.Cleanup(func() { _ = mn.Close() })
			nodes := buildTestNodes(b, n, "pssp:10:4", 1, memHosts(b, mn))
			settle(b, nodes)
			check := func(nd *Node) time.Duration {
				t0 := time.Now()
				obs := nd.bar.Observe(context.Background())
				nd.decider.Decide(nd.step.Load(), 0, obs)
				return time.Since(t0)
			}
			b.Run("idle", func(b *testing.B) {
				var lat []time.Duration
				i := 0
				for b.Loop() {
					lat = append(lat, check(nodes[i%n]))
					i++
				}
				reportLatency(b, lat)
			})
			b.Run("polling", func(b *testing.B) {
				// One 20-s pass, whatever -benchtime says.
				var mu sync.Mutex
				var lat []time.Duration
				end := time.Now().Add(20 * time.Second)
				var wg sync.WaitGroup
				for _, nd := range nodes {
					wg.Go(func() {
						var mine []time.Duration
						for time.Now().Before(end) {
							mine = append(mine, check(nd))
							time.Sleep(62 * time.Millisecond)
						}
						mu.Lock()
						lat = append(lat, mine...)
						mu.Unlock()
					})
				}
				wg.Wait()
				reportLatency(b, lat)
			})
		})
	}
}

// settle waits until every node can draw a sample of 10 and then 20 s more,
// past the overlay's warm-up walks.
func settle(b *testing.B, nodes []*Node) {
	b.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for _, nd := range nodes {
		for {
			if _, err := nd.Overlay().Sample(context.Background(), 10); err == nil {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("node %s cannot sample 10 peers after 2 min: %+v", nd.ID(), nd.Overlay().Status())
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	time.Sleep(20 * time.Second)
}

func reportLatency(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(ms(lat[len(lat)/2]), "p50-ms")
	b.ReportMetric(ms(lat[len(lat)*99/100]), "p99-ms")
	b.ReportMetric(float64(len(lat)), "checks")
}
