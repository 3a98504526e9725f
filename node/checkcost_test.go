package node

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/p2p/protocol/ping"

	"github.com/pspnode/pspnode/internal/builtin"
	"github.com/pspnode/pspnode/internal/memnet"
	"github.com/pspnode/pspnode/psp"
)

// BenchmarkCheckCost measures what one barrier check of pSSP(10,4) costs
// at β = 10: its latency, and the CPU it takes at both ends (the checker
// drawing, asking and deciding; the ten peers answering). One node checks
// again and again against ten peers that do not train, so every check asks
// all ten:
//
//   - mem: eleven nodes in this process on the in-memory transport;
//   - tcp: eleven nodes in this process over TCP loopback;
//   - tcp-2proc: the checker here, the ten peers in a child process (this
//     test binary, re-executed), over TCP loopback: what separate machines
//     pay, without the network.
//
// CPU is the process CPU time (user + system) of both processes over the
// checks, less what the same nodes spend idle for as long (overlay and
// connection upkeep), divided by the checks. rtt-ms is one libp2p ping
// round trip between the same hosts; floor-p50-ms and floor-cpu-us are
// what the same number of rounds of ten bare libp2p pings in parallel,
// one to each peer, each on a stream of its own kept open, take and cost:
// a check's exchanges with nothing of the node's around them, the floor
// of the transport stack. For where
// the CPU goes, add -cpuprofile: the checker's process writes the file
// named (the floor's rounds included), and on tcp-2proc the peers'
// process writes it with ".peers" appended (each run of -count writes it
// anew: the last run's is left).
//
//	go test -run '^$' -bench '^BenchmarkCheckCost$' -benchtime 3000x ./node/
func BenchmarkCheckCost(b *testing.B) {
	b.Run("mem", func(b *testing.B) {
		mn := memnet.New(0)
		b.Cleanup(func() { _ = mn.Close() })
		mk := memHosts(b, mn)
		nodes := checkCostNodes(b, 11, func() host.Host {
			h := mk()
			ping.NewPingService(h) // for the floor, as libp2p.New's hosts serve it
			return h
		}, nil)
		measureChecks(b, nodes[0], nil)
	})
	b.Run("tcp", func(b *testing.B) {
		nodes := checkCostNodes(b, 11, nil, nil)
		measureChecks(b, nodes[0], nil)
	})
	b.Run("tcp-2proc", func(b *testing.B) {
		child, boot := startResponders(b, 10)
		nodes := checkCostNodes(b, 1, nil, []string{boot})
		measureChecks(b, nodes[0], child)
	})
}

// checkCostNodes builds n nodes with no model (the step is the time
// model's sleep, and nothing runs it), each bootstrapped from the first or
// from boot.
func checkCostNodes(tb testing.TB, n int, mk func() host.Host, boot []string) []*Node {
	tb.Helper()
	var nodes []*Node
	for i := range n {
		nd, err := newCheckCostNode(i, mk, boot)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { nd.Close() })
		nodes = append(nodes, nd)
		if boot == nil {
			boot = []string{nd.Addrs()[0].String()}
		}
	}
	return nodes
}

func newCheckCostNode(i int, mk func() host.Host, boot []string) (*Node, error) {
	cfg := DefaultConfig()
	cfg.Job = "checkcost"
	cfg.Listen = []string{"/ip4/127.0.0.1/tcp/0"}
	opts := []Option{WithTask(builtin.NewSleepTask(builtin.TimeModel{Scale: 1, Factor: 1}, uint64(i+1)))}
	if mk != nil {
		opts = append(opts, WithHost(mk()))
	}
	cfg.Bootstrap = boot
	cfg.Barrier = psp.MustParse("pssp:10:4")
	cfg.Seed = uint64(i + 1)
	return New(context.Background(), cfg, opts...)
}

// measureChecks waits until nd can draw 10 peers, checks until b.Loop
// ends, and reports latency and CPU per check (child: the other process
// whose CPU counts, or nil).
func measureChecks(b *testing.B, nd *Node, child *responders) {
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := nd.Overlay().Sample(context.Background(), 10); err == nil {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("cannot sample 10 peers after 1 min: %+v", nd.Overlay().Status())
		}
		time.Sleep(50 * time.Millisecond)
	}
	cpu := func() time.Duration {
		c := processCPU()
		if child != nil {
			c += child.cpu(b)
		}
		return c
	}
	check := func() time.Duration {
		t0 := time.Now()
		obs := nd.bar.Observe(context.Background())
		if len(obs) < 10 {
			b.Fatalf("check got %d answers, want 10", len(obs))
		}
		nd.decider.Decide(nd.step.Load(), 0, obs)
		return time.Since(t0)
	}
	for range 50 { // open the step streams
		check()
	}
	var lat []time.Duration
	c0, t0 := cpu(), time.Now()
	for b.Loop() {
		lat = append(lat, check())
	}
	busyCPU, wall := cpu()-c0, time.Since(t0)
	// The same nodes' CPU while nobody checks, for as long (at most 5 s).
	idle := min(wall, 5*time.Second)
	c1 := cpu()
	time.Sleep(idle)
	idleRate := float64(cpu()-c1) / float64(idle)
	net := float64(busyCPU) - idleRate*float64(wall)
	slices.Sort(lat)
	ms := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }
	b.ReportMetric(ms(lat[len(lat)/2]), "p50-ms")
	b.ReportMetric(ms(lat[len(lat)*99/100]), "p99-ms")
	b.ReportMetric(net/float64(len(lat))/1e3, "cpu-us/check")
	b.ReportMetric(idleRate, "idle-cores")
	if rtt, ok := pingRTT(nd); ok { // the hosts serve ping
		b.ReportMetric(ms(rtt), "rtt-ms")
		measureFloor(b, nd, len(lat), cpu, idleRate)
	}
}

// measureFloor runs rounds of ten libp2p pings in parallel, one to each
// of ten peers of nd on a stream kept open for each, and reports their p50
// and CPU per round as measureChecks does (cpu and idleRate as there).
func measureFloor(b *testing.B, nd *Node, rounds int, cpu func() time.Duration, idleRate float64) {
	peers := nd.Overlay().Peers()
	if len(peers) < 10 {
		b.Fatalf("floor: %d peers, want 10", len(peers))
	}
	var streams []network.Stream
	for _, p := range peers[:10] {
		s, err := nd.Host().NewStream(context.Background(), p, ping.ID)
		if err != nil {
			b.Fatalf("floor: %v", err)
		}
		defer s.Reset()
		streams = append(streams, s)
	}
	errs := make(chan error, len(streams))
	round := func() time.Duration {
		t0 := time.Now()
		for _, s := range streams {
			go func() {
				var buf [ping.PingSize]byte
				_, err := s.Write(buf[:])
				if err == nil {
					_, err = io.ReadFull(s, buf[:])
				}
				errs <- err
			}()
		}
		for range streams {
			if err := <-errs; err != nil {
				b.Fatalf("floor: %v", err)
			}
		}
		return time.Since(t0)
	}
	for range 50 {
		round()
	}
	var lat []time.Duration
	c0, t0 := cpu(), time.Now()
	for range rounds {
		lat = append(lat, round())
	}
	net := float64(cpu()-c0) - idleRate*float64(time.Since(t0))
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e6, "floor-p50-ms")
	b.ReportMetric(net/float64(rounds)/1e3, "floor-cpu-us")
}

// pingRTT is the median of 50 libp2p pings from nd to one of its peers.
func pingRTT(nd *Node) (time.Duration, bool) {
	peers := nd.Overlay().Peers()
	if len(peers) == 0 {
		return 0, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ch := ping.Ping(ctx, nd.Host(), peers[0])
	var rtts []time.Duration
	for range 50 {
		r, ok := <-ch
		if !ok || r.Error != nil {
			return 0, false
		}
		rtts = append(rtts, r.RTT)
	}
	slices.Sort(rtts)
	return rtts[len(rtts)/2], true
}

// processCPU is this process's CPU time, user and system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestMain serves responders when re-executed by startResponders, and
// runs the tests otherwise.
func TestMain(m *testing.M) {
	if v := os.Getenv(respondersEnv); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "%s=%q: want a count of nodes\n", respondersEnv, v)
			os.Exit(2)
		}
		os.Exit(serveResponders(n))
	}
	os.Exit(m.Run())
}

// respondersEnv makes this test binary serve responders (TestMain);
// respondersProfileEnv names the file for their CPU profile, if any.
const (
	respondersEnv        = "PSPNODE_CHECKCOST_RESPONDERS"
	respondersProfileEnv = "PSPNODE_CHECKCOST_CPUPROFILE"
)

// responders is a child process holding peers for the checker.
type responders struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

// startResponders starts n responder nodes in a child process and returns
// it and the multiaddr to bootstrap from.
func startResponders(b *testing.B, n int) (*responders, string) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), respondersEnv+"="+strconv.Itoa(n))
	if f := flag.Lookup("test.cpuprofile"); f != nil && f.Value.String() != "" {
		cmd.Env = append(cmd.Env, respondersProfileEnv+"="+f.Value.String()+".peers")
	}
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	r := &responders{cmd: cmd, in: in, out: bufio.NewScanner(out)}
	b.Cleanup(func() {
		_ = in.Close() // the child closes its nodes and exits
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	line := r.line(b)
	addr, ok := strings.CutPrefix(line, "addr ")
	if !ok {
		b.Fatalf("responders: want their address, got %q", line)
	}
	return r, addr
}

func (r *responders) line(b *testing.B) string {
	if !r.out.Scan() {
		b.Fatalf("responders ended: %v", r.out.Err())
	}
	return r.out.Text()
}

// cpu asks the child for its CPU time.
func (r *responders) cpu(b *testing.B) time.Duration {
	if _, err := io.WriteString(r.in, "cpu\n"); err != nil {
		b.Fatal(err)
	}
	ns, err := strconv.ParseInt(r.line(b), 10, 64)
	if err != nil {
		b.Fatal(err)
	}
	return time.Duration(ns)
}

// serveResponders is the child's side: n nodes on TCP loopback, the
// first's address on stdout, then one line of CPU nanoseconds for every
// "cpu" line read; at the end of stdin the nodes close.
func serveResponders(n int) int {
	if path := os.Getenv(respondersProfileEnv); path != "" {
		f, err := os.Create(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, "responders:", err)
			return 1
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, "responders:", err)
			return 1
		}
		defer pprof.StopCPUProfile() // after the nodes close (defers run last first)
	}
	var nodes []*Node
	defer func() {
		for _, nd := range nodes {
			nd.Close()
		}
	}()
	var boot []string
	for i := range n {
		nd, err := newCheckCostNode(100+i, nil, boot)
		if err != nil {
			fmt.Fprintln(os.Stderr, "responders:", err)
			return 1
		}
		nodes = append(nodes, nd)
		if boot == nil {
			boot = []string{nd.Addrs()[0].String()}
		}
	}
	fmt.Printf("addr %s\n", boot[0])
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if in.Text() == "cpu" {
			fmt.Println(int64(processCPU()))
		}
	}
	return 0
}
