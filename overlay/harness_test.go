package overlay

import (
	"github.com/pspnode/pspnode/internal/memnet"
	"github.com/pspnode/pspnode/internal/procstat"

	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	kb "github.com/libp2p/go-libp2p-kbucket"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
)

// The benchmark harness: N real libp2p hosts (go-libp2p mocknet with
// on-demand links and a connection manager, or TCP loopback) each running
// an Overlay with DefaultConfig, adjusted by ForSharedMachine (above
// SharedMachineNodes, 500, the background periods stretch by N/500, as in
// pspnode testnet).
// One run per sub-benchmark; use
// -benchtime=1x. See docs/overlay.md for the commands and figures.
//
//	go test -run '^$' -bench 'BenchmarkOverlay/N=200$' -benchtime=1x -timeout 60m ./overlay/

func BenchmarkOverlay(b *testing.B) {
	for _, n := range []int{50, 200, 500, 1000} {
		b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) { runHarness(b, n, false) })
	}
}

func BenchmarkOverlayTCP(b *testing.B) {
	for _, n := range []int{50, 100} {
		b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) { runHarness(b, n, true) })
	}
}

type hnode struct {
	h    host.Host
	o    *Overlay
	gone bool
}

// harness timing (overridable for quick trials with PSP_HARNESS_SCALE=0.25)
func hdur(d time.Duration) time.Duration {
	if s, err := strconv.ParseFloat(os.Getenv("PSP_HARNESS_SCALE"), 64); err == nil && s > 0 {
		return time.Duration(float64(d) * s)
	}
	return d
}

func runHarness(b *testing.B, n int, tcp bool) {
	for b.Loop() {
		harnessOnce(b, n, tcp)
	}
}

// harness is one run of the benchmark harness: N overlays joining, settling,
// sampled, then a fifth of them leaving.
type harness struct {
	b     *testing.B
	n     int
	tcp   bool
	start time.Time
	ln    *memnet.Net
	cfg   Config // every node's
	nodes []*hnode
	byID  map[peer.ID]int
	mu    sync.Mutex // guards the nodes' gone flags
}

func (hs *harness) logf(format string, args ...any) {
	fmt.Printf("[%6.1fs] N=%d %s\n", time.Since(hs.start).Seconds(), hs.n, fmt.Sprintf(format, args...))
}

func harnessOnce(b *testing.B, n int, tcp bool) {
	hs := &harness{b: b, n: n, tcp: tcp, start: time.Now(), ln: memnet.New(0), nodes: make([]*hnode, n), byID: make(map[peer.ID]int, n)}
	defer func() { _ = hs.ln.Close() }()
	defer hs.closeAll()
	lastJoin := hs.join()
	stop := hs.exchangeEstimates()
	defer stop()

	// CPU over the last 20 s of the 60-s settle window.
	settle := hdur(60 * time.Second)
	time.Sleep(time.Until(lastJoin.Add(settle - hdur(20*time.Second))))
	stopProfile := startCPUProfile(b, os.Getenv("PSP_HARNESS_CPUPROFILE"))
	cpu0, wall0 := procstat.CPUTime().Seconds(), time.Now()
	time.Sleep(time.Until(lastJoin.Add(settle)))
	cores := (procstat.CPUTime().Seconds() - cpu0) / time.Since(wall0).Seconds()
	stopProfile()

	if f := os.Getenv("PSP_HARNESS_HEAPPROFILE"); f != "" {
		writeHeapProfile(b, f)
	}
	live := hs.live()
	estMed, estP95, locMed, locP95, estFail := estimateErrors(live, float64(n))
	hs.logf("estimator detail: %s", detailSummary(live, float64(n)))
	hs.logf("in-degree (pools holding a node): %s", inDegreeSummary(live))
	coverage, drawable, rtAvg, connAvg := membershipStats(live, n)
	hs.logf("estimate fused median %.3f p95 %.3f (local %.3f / %.3f, %d without estimate); members/N %.2f, drawable/N %.2f, RT %.1f, conns %.1f, CPU %.2f cores",
		estMed, estP95, locMed, locP95, estFail, coverage, drawable, rtAvg, connAvg, cores)

	// Sampling: 10 rounds in which every node calls Sample(β=10): 100·N
	// picks pooled. Once with rounds 1 s apart (the pools, which rotate one
	// member every 2 s, barely change: this measures the instantaneous
	// union of the pools), and once with rounds 6 s apart (a minute, about
	// 30 barrier checks of a node at the paper's task time, during which
	// each pool rotates half its members: what a barrier sees over time).
	maxm, minm, chi2, p, lat, sampleErrs := hs.samplePass(hdur(time.Second))
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	p50, p99 := lat[len(lat)/2], lat[len(lat)*99/100]
	rss := procstat.PeakRSS()
	hs.logf("sampling over 10 s: max/mean %.2f min/mean %.2f chi2 %.0f (df %d) p=%.3g, %d errors; Sample p50 %v p99 %v; peak RSS %d MiB",
		maxm, minm, chi2, n-1, p, sampleErrs, p50, p99, rss>>20)
	maxM, minM, chi2M, pM, _, errsM := hs.samplePass(hdur(6 * time.Second))
	hs.logf("sampling over 60 s: max/mean %.2f min/mean %.2f chi2 %.0f (df %d) p=%.3g, %d errors",
		maxM, minM, chi2M, n-1, pM, errsM)

	ch := hs.churn()
	rss = procstat.PeakRSS()

	b.ReportMetric(estMed, "est-med")
	b.ReportMetric(estP95, "est-p95")
	b.ReportMetric(maxm, "max/mean")
	b.ReportMetric(minm, "min/mean")
	b.ReportMetric(p, "chi2-p")
	b.ReportMetric(maxM, "max/mean-60s")
	b.ReportMetric(minM, "min/mean-60s")
	b.ReportMetric(pM, "chi2-p-60s")
	b.ReportMetric(float64(p50.Microseconds()), "sample-p50-µs")
	b.ReportMetric(float64(p99.Microseconds()), "sample-p99-µs")
	b.ReportMetric(float64(rss>>20), "peak-MiB")
	b.ReportMetric(cores, "cores")
	b.ReportMetric(ch.med, "churn-est-med")
	b.ReportMetric(float64(ch.bad30), "churn-departed-picks-30s")
	transport := "mocknet"
	if tcp {
		transport = "tcp"
	}
	fmt.Printf("| %s | %d | %.3f / %.3f | %.3f / %.3f | %.2f / %.2f / %.3g | %v / %v | %d | %.2f | %.3f / %.3f | %d/%d | %d/%d |\n",
		transport, n, estMed, estP95, locMed, locP95, maxm, minm, p, p50.Round(time.Microsecond), p99.Round(time.Microsecond),
		rss>>20, cores, ch.med, ch.p95, ch.bad10, ch.tot10, ch.bad30, ch.tot30)
}

// closeAll closes the nodes that have not left.
func (hs *harness) closeAll() {
	var wg sync.WaitGroup
	for _, nd := range hs.nodes {
		if nd != nil && !nd.gone {
			wg.Go(func() { _ = nd.o.Close(); _ = nd.h.Close() })
		}
	}
	wg.Wait()
}

func (hs *harness) newHost() (host.Host, error) {
	if hs.tcp {
		key, _, err := crypto.GenerateEd25519Key(nil)
		if err != nil {
			return nil, err
		}
		return tcpHostB(key)
	}
	return hs.ln.NewHost(connLimits(hs.n))
}

// join starts the N nodes, each bootstrapping through two random earlier
// nodes, and returns when the last joined.
func (hs *harness) join() (lastJoin time.Time) {
	hs.cfg = DefaultConfig().ForSharedMachine(hs.n)
	hs.cfg.Job = "bench"
	if hs.tcp {
		// Over TCP every connection holds two sockets of this process, and
		// pool connections are protected at both ends (about 2 × PoolSize
		// per node, plus the zone). pspnode testnet uses the same pool over
		// TCP. 200 nodes pass the 20 000 open files during the join (with
		// any pool size, and before pool announcements too).
		hs.cfg.PoolSize = 32
	}
	for i := range hs.n {
		h, err := hs.newHost()
		if err != nil {
			hs.b.Fatal(err)
		}
		cfg := hs.cfg // hs.cfg has no bootstrap peers: append below makes a fresh slice
		if i > 0 {
			for _, j := range []int{rand.IntN(i), rand.IntN(i)} {
				cfg.BootstrapPeers = append(cfg.BootstrapPeers, peer.AddrInfo{ID: hs.nodes[j].h.ID(), Addrs: hs.nodes[j].h.Addrs()})
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		o, err := New(ctx, h, cfg)
		cancel()
		if err != nil {
			hs.b.Fatalf("node %d: %v", i, err)
		}
		hs.nodes[i] = &hnode{h: h, o: o}
		hs.byID[h.ID()] = i
		time.Sleep(20 * time.Millisecond)
	}
	lo, hi := connLimits(hs.n)
	if hs.tcp {
		lo, hi = tcpConnLow, tcpConnHigh
	}
	hs.logf("all joined in %.1fs (walk every %v, pool rotation every %v, refresh every %v, estimate window %v; pool %d, connections %d-%d)",
		time.Since(hs.start).Seconds(), hs.cfg.WalkInterval, hs.cfg.RotateInterval, hs.cfg.RefreshInterval, hs.cfg.EstimateWindow, hs.cfg.PoolSize, lo, hi)
	return time.Now()
}

// gone reports whether nd has left.
func (hs *harness) gone(nd *hnode) bool {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	return nd.gone
}

// exchangeEstimates emulates the node's step replies until stop is called:
// every 2 s each node samples β=10 and hears their local estimates.
func (hs *harness) exchangeEstimates() (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(2 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			for _, nd := range hs.nodes {
				if hs.gone(nd) {
					continue
				}
				s, err := nd.o.Sample(context.Background(), 10)
				if err != nil {
					continue
				}
				for _, p := range s {
					other := hs.nodes[hs.byID[p]]
					if hs.gone(other) {
						continue
					}
					if est, _, err := other.o.LocalEstimate(); err == nil {
						nd.o.ObserveEstimate(p, est)
					}
				}
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

// live returns the nodes that have not left.
func (hs *harness) live() []*hnode {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	var out []*hnode
	for _, nd := range hs.nodes {
		if !nd.gone {
			out = append(out, nd)
		}
	}
	return out
}

// samplePass has every live node call Sample(β=10) in 10 rounds gap apart,
// and returns the uniformity of the picks and each call's latency.
func (hs *harness) samplePass(gap time.Duration) (maxm, minm, chi2, p float64, lat []time.Duration, errs int) {
	counts := make(map[peer.ID]int, hs.n)
	byCPL := newCPLBias(hs.live())
	for round := range 10 {
		if round > 0 {
			time.Sleep(gap)
		}
		for _, nd := range hs.live() {
			t0 := time.Now()
			s, err := nd.o.Sample(context.Background(), 10)
			lat = append(lat, time.Since(t0))
			if err != nil {
				errs++
				continue
			}
			for _, p := range s {
				counts[p]++
				byCPL.pick(nd.h.ID(), p)
			}
		}
	}
	hs.logf("draws by common-prefix length with the drawer, observed/uniform: %s", byCPL)
	cs := make([]int, 0, hs.n)
	for _, nd := range hs.nodes {
		cs = append(cs, counts[nd.h.ID()])
	}
	maxm, minm, chi2, p = uniformity(cs)
	hs.logf("selection frequency / mean by join quarter: %s; by how many nodes know the peer (quarters, fewest first): %s",
		quarterMeans(cs, nil), quarterMeans(cs, knownBy(hs.live(), hs.nodes)))
	return maxm, minm, chi2, p, lat, errs
}

// churnFigures are what the harness measures after a fifth of the nodes left.
type churnFigures struct {
	bad10, tot10, bad30, tot30 int     // departed peers drawn, of all draws, 10 and 30 s after
	med, p95                   float64 // the estimate's relative error 60 s after
}

// churn has 20 % of the nodes leave abruptly (host closed; its links refuse
// dials) and measures how fast samples and estimates forget them.
func (hs *harness) churn() churnFigures {
	departed := make(map[peer.ID]bool)
	var wg sync.WaitGroup
	for _, i := range rand.Perm(hs.n)[:hs.n/5] {
		nd := hs.nodes[i]
		hs.mu.Lock()
		nd.gone = true
		hs.mu.Unlock()
		departed[nd.h.ID()] = true
		wg.Go(func() { _ = nd.h.Close(); _ = nd.o.Close() })
	}
	wg.Wait()
	left := time.Now()
	newN := float64(hs.n - hs.n/5)
	hs.logf("%d nodes left", hs.n/5)
	departedIn := func() (bad, total int) {
		for range 5 {
			for _, nd := range hs.live() {
				s, err := nd.o.Sample(context.Background(), 10)
				if err != nil {
					continue
				}
				for _, p := range s {
					total++
					if departed[p] {
						bad++
					}
				}
			}
		}
		return bad, total
	}
	var f churnFigures
	time.Sleep(time.Until(left.Add(hdur(10 * time.Second))))
	f.bad10, f.tot10 = departedIn()
	time.Sleep(time.Until(left.Add(hdur(30 * time.Second))))
	f.bad30, f.tot30 = departedIn()
	time.Sleep(time.Until(left.Add(hdur(60 * time.Second))))
	var locMed, locP95 float64
	var fail int
	f.med, f.p95, locMed, locP95, fail = estimateErrors(hs.live(), newN)
	hs.logf("estimator detail: %s", detailSummary(hs.live(), newN))
	hs.logf("churn: departed picks %d/%d at +10s, %d/%d at +30s; estimate at +60s median %.3f p95 %.3f (local %.3f / %.3f, %d without); peak RSS %d MiB",
		f.bad10, f.tot10, f.bad30, f.tot30, f.med, f.p95, locMed, locP95, fail, procstat.PeakRSS()>>20)
	return f
}

// startCPUProfile profiles the process's CPU into file (none when file is
// empty) until the returned function is called: the harness profiles the
// same 20 s of rest that its CPU figure covers.
func startCPUProfile(b *testing.B, file string) (stop func()) {
	if file == "" {
		return func() {}
	}
	f, err := os.Create(file)
	if err != nil {
		b.Logf("cpu profile: %v", err)
		return func() {}
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		b.Logf("cpu profile: %v", err)
		_ = f.Close()
		return func() {}
	}
	return func() { pprof.StopCPUProfile(); _ = f.Close() }
}

// writeHeapProfile writes the live heap (after a collection) to file, for
// go tool pprof -sample_index=inuse_space.
func writeHeapProfile(b *testing.B, file string) {
	f, err := os.Create(file)
	if err != nil {
		b.Logf("heap profile: %v", err)
		return
	}
	defer func() { _ = f.Close() }()
	runtime.GC()
	if err := pprof.WriteHeapProfile(f); err != nil {
		b.Logf("heap profile: %v", err)
	}
}

// connLimits returns the mocknet hosts' connection-manager watermarks:
// PSP_HARNESS_CONNS="low,high", default 150,250, and 32,96 above 500 nodes
// (each connection end costs tens of kilobytes: 1000 nodes at 150,250 would
// not fit in 8 GiB).
func connLimits(n int) (int, int) {
	lo, hi := 150, 250
	if n > 500 {
		lo, hi = 32, 96
	}
	if v := os.Getenv("PSP_HARNESS_CONNS"); v != "" {
		if a, b, ok := strings.Cut(v, ","); ok {
			l, err1 := strconv.Atoi(a)
			h, err2 := strconv.Atoi(b)
			if err1 == nil && err2 == nil && l > 0 && h >= l {
				lo, hi = l, h
			}
		}
	}
	return lo, hi
}

func estimateErrors(nodes []*hnode, n float64) (med, p95, locMed, locP95 float64, fails int) {
	var errs, lerrs []float64
	for _, nd := range nodes {
		if est, _, err := nd.o.Estimate(); err == nil {
			errs = append(errs, math.Abs(est-n)/n)
		} else {
			fails++
		}
		if est, _, err := nd.o.LocalEstimate(); err == nil {
			lerrs = append(lerrs, math.Abs(est-n)/n)
		}
	}
	q := func(xs []float64, f float64) float64 {
		if len(xs) == 0 {
			return math.NaN()
		}
		sort.Float64s(xs)
		return xs[min(len(xs)-1, int(f*float64(len(xs))))]
	}
	return q(errs, 0.5), q(errs, 0.95), q(lerrs, 0.5), q(lerrs, 0.95), fails
}

// detailSummary gives the median signed relative error of each estimator
// and how often each is available.
func detailSummary(nodes []*hnode, n float64) string {
	var z, o, f []float64
	for _, nd := range nodes {
		d := nd.o.EstimateDetail()
		if d.ZoneN > 0 {
			z = append(z, d.ZoneN/n-1)
		}
		if d.OrderN > 0 {
			o = append(o, d.OrderN/n-1)
		}
		if d.Err == nil {
			f = append(f, d.N/n-1)
		}
	}
	med := func(xs []float64) float64 {
		if len(xs) == 0 {
			return math.NaN()
		}
		sort.Float64s(xs)
		return xs[len(xs)/2]
	}
	return fmt.Sprintf("signed median rel err: zone %+.3f (%d nodes), order %+.3f (%d), fused %+.3f (%d)",
		med(z), len(z), med(o), len(o), med(f), len(f))
}

// membershipStats gives the nodes' mean share of the population known
// (members) and drawable by Sample (self included in both), routing-table
// size and open connections.
func membershipStats(nodes []*hnode, n int) (coverage, drawable, rt, conns float64) {
	for _, nd := range nodes {
		st := nd.o.Status()
		coverage += float64(st.Members+1) / float64(n)
		drawable += float64(st.Drawable+1) / float64(n)
		rt += float64(st.RoutingTableSize)
		conns += float64(len(nd.h.Network().Conns()))
	}
	k := float64(len(nodes))
	return coverage / k, drawable / k, rt / k, conns / k
}

// cplBias compares the common-prefix lengths (CPL) of drawer and drawn
// peer with what uniform draws over the live nodes would give: routing
// tables and zones hold every peer near a node in ID space but only some of
// the far ones, so a sampler drawing from what a node knows over-draws
// near peers (high CPL) unless it knows nearly everyone.
type cplBias struct {
	keys     map[peer.ID][]byte
	share    map[peer.ID]*[cplBins]float64 // per drawer: the live population's share in each bin
	observed [cplBins]float64
	expected [cplBins]float64
}

const cplBins = 6 // CPL 0, 1, 2, 3, 4, ≥ 5

func newCPLBias(live []*hnode) *cplBias {
	b := &cplBias{keys: make(map[peer.ID][]byte, len(live)), share: make(map[peer.ID]*[cplBins]float64, len(live))}
	for _, nd := range live {
		b.keys[nd.h.ID()] = kb.ConvertPeerID(nd.h.ID())
	}
	for _, a := range live {
		var sh [cplBins]float64
		ka := b.keys[a.h.ID()]
		for _, c := range live {
			if c != a {
				sh[min(cpl(ka, b.keys[c.h.ID()]), cplBins-1)]++
			}
		}
		for i := range sh {
			sh[i] /= float64(len(live) - 1)
		}
		b.share[a.h.ID()] = &sh
	}
	return b
}

func (b *cplBias) pick(drawer, p peer.ID) {
	sh, ok := b.share[drawer]
	kp, ok2 := b.keys[p]
	if !ok || !ok2 {
		return
	}
	b.observed[min(cpl(b.keys[drawer], kp), cplBins-1)]++
	for i := range sh {
		b.expected[i] += sh[i]
	}
}

func (b *cplBias) String() string {
	var parts []string
	for i := range b.observed {
		label := strconv.Itoa(i)
		if i == cplBins-1 {
			label = "≥" + label
		}
		parts = append(parts, fmt.Sprintf("%s: %.2f", label, b.observed[i]/b.expected[i]))
	}
	return strings.Join(parts, ", ")
}

// inDegreeSummary gives the spread of the nodes' in-degrees (how many pools
// hold each): without Sample's weights, selection frequency would follow it.
func inDegreeSummary(nodes []*hnode) string {
	lo, hi, sum := math.MaxInt, 0, 0
	for _, nd := range nodes {
		d := nd.o.Status().InDegree
		lo, hi, sum = min(lo, d), max(hi, d), sum+d
	}
	mean := float64(sum) / float64(len(nodes))
	return fmt.Sprintf("mean %.1f, min/mean %.2f, max/mean %.2f", mean, float64(lo)/mean, float64(hi)/mean)
}

// knownBy returns, for each node in nodes, how many of the live nodes hold
// it as a live member: how widely the overlay knows it.
func knownBy(live, nodes []*hnode) []float64 {
	count := make(map[peer.ID]int, len(nodes))
	for _, nd := range live {
		for _, p := range nd.o.Peers() {
			count[p]++
		}
	}
	out := make([]float64, len(nodes))
	for i, nd := range nodes {
		out[i] = float64(count[nd.h.ID()])
	}
	return out
}

// quarterMeans splits the counts into four quarters, by index (key nil: by
// join order) or by ascending key, and gives each quarter's mean count over
// the overall mean: where the sampler's bias lies.
func quarterMeans(counts []int, key []float64) string {
	idx := make([]int, len(counts))
	for i := range idx {
		idx[i] = i
	}
	if key != nil {
		sort.SliceStable(idx, func(a, b int) bool { return key[idx[a]] < key[idx[b]] })
	}
	total := 0
	for _, c := range counts {
		total += c
	}
	if total == 0 || len(counts) < 4 {
		return "n/a"
	}
	mean := float64(total) / float64(len(counts))
	var parts []string
	for q := range 4 {
		lo, hi := q*len(idx)/4, (q+1)*len(idx)/4
		sum := 0
		for _, i := range idx[lo:hi] {
			sum += counts[i]
		}
		parts = append(parts, fmt.Sprintf("%.2f", float64(sum)/float64(hi-lo)/mean))
	}
	return strings.Join(parts, " ")
}
