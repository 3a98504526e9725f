package netns

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"
)

func needLinkTools(t *testing.T) {
	t.Helper()
	if err := CheckLinks(); err != nil {
		t.Fatalf("%v (CI runs as root after scripts/test-deps.sh installs iproute2)", err)
	}
}

// TestLinkedHosts: two hosts on emulated links of 5 ms each way and 1 MB/s
// have a TCP round trip of at least 18 ms on every ping (4 × 5 ms asked;
// the switch only adds delay, so no ping may be faster whatever the
// machine's load), carry a bulk transfer no faster than the rate (shaping
// only slows), and count what they sent; Close leaves nothing.
func TestLinkedHosts(t *testing.T) {
	needLinkTools(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n, err := New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			_ = n.Close()
		}
	}()
	l := Link{Delay: 5 * time.Millisecond, Rate: 1e6}
	a, err := n.AddLinkedHost(ctx, 0, l)
	if err != nil {
		t.Fatal(err)
	}
	b, err := n.AddLinkedHost(ctx, 1, l)
	if err != nil {
		t.Fatal(err)
	}
	tx0, err := a.TxBytes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const bulk = 2_000_000
	st, err := MeasureLink(ctx, a, b, 20, bulk)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(st)
	if len(st.RTTs) != 20 {
		t.Fatalf("%d round trips, want 20", len(st.RTTs))
	}
	// Each of the four crossings holds a frame at least 5 ms; allow 2 ms
	// for the clocks.
	fast := 0
	for _, r := range st.RTTs {
		if r < 18*time.Millisecond {
			fast++
		}
	}
	if fast > 0 {
		t.Errorf("%d of %d round trips under 18 ms through links of 5 ms each way (20 ms asked): %v", fast, len(st.RTTs), st.RTTs)
	}
	// The second half of the transfer, past the bucket's burst, cannot
	// beat the rate; allow 25 % for the burst and the timing.
	if st.Rate > 1.25e6 || st.RateAll > 1.25e6 {
		t.Errorf("bulk at %.0f B/s (whole transfer %.0f) through a 1 MB/s limit", st.Rate, st.RateAll)
	}
	tx1, err := a.TxBytes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if tx1-tx0 < bulk {
		t.Errorf("the sender's eth0 counted %d bytes sent, want at least the %d of the transfer", tx1-tx0, bulk)
	}
	if c := n.LinkCounters(); c.Frames == 0 || c.Bytes < bulk || c.Dropped > 0 || c.CPU <= 0 {
		t.Errorf("the switch carried %+v for a %d-byte transfer: want at least that many bytes, no drops, some CPU", c, int64(bulk))
	}
	closed = true
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	assertGone(t, n.ID, "")
}

func TestParseTxBytes(t *testing.T) {
	tests := []struct {
		name, in string
		want     int64
		ok       bool
	}{
		{"iproute2 6", `5: eth0: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc tbf state UNKNOWN mode DEFAULT group default qlen 1000\    link/ether 86:4b:73:3a:fc:f1 brd ff:ff:ff:ff:ff:ff\    RX:   bytes packets errors dropped  missed   mcast           \    13885429686 2583484      0       0       0       0 \    TX:   bytes packets errors dropped carrier collsns           \    4200 17      0       0       0       0 `, 4200, true},
		{"no counters", `5: eth0: <UP> mtu 1500`, 0, false},
		{"no number", `TX: bytes packets`, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseTxBytes(tt.in)
			if (err == nil) != tt.ok || got != tt.want {
				t.Errorf("parseTxBytes = %d, %v; want %d (ok %v)", got, err, tt.want, tt.ok)
			}
		})
	}
}

// TestSwitchRoute: the switch floods group addresses and addresses it has
// not seen, learns where a source is, and sends a frame back out of the
// port it came in by no one.
func TestSwitchRoute(t *testing.T) {
	p := []*port{{}, {}, {}}
	s := &table{ports: p, where: map[[6]byte]*port{}}
	a := [6]byte{0x02, 0, 0, 0, 0, 0xa}
	b := [6]byte{0x02, 0, 0, 0, 0, 0xb}
	c := [6]byte{0x02, 0, 0, 0, 0, 0xc}
	bcast := [6]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	tests := []struct {
		name     string
		from     int
		src, dst [6]byte
		want     []int
	}{
		{"broadcast floods", 0, a, bcast, []int{1, 2}},
		{"learned a behind 0", 1, b, a, []int{0}},
		{"unseen c floods", 0, a, c, []int{1, 2}},
		{"learned b behind 1", 2, c, b, []int{1}},
		{"to its own port: nowhere", 0, a, a, nil},
		{"a moved to 2", 2, a, b, []int{1}},
		{"and is reached there", 1, b, a, []int{2}},
	}
	for _, tt := range tests {
		to := s.route(p[tt.from], tt.src, tt.dst, nil)
		var got []int
		for _, q := range to {
			for i := range p {
				if p[i] == q {
					got = append(got, i)
				}
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(tt.want) {
			t.Errorf("%s: frame from port %d went to %v, want %v", tt.name, tt.from, got, tt.want)
		}
	}
}

// BenchmarkLinkedPing: TCP round trips of one byte between two linked
// hosts, through the switch; cpu-µs/op is this process's CPU per round trip
// (two frames and perhaps their acknowledgements cross the switch; the
// sockets' ends and the receiving kernels' work run here too). "bridge" is
// the same between two hosts on the bridge (veth, no delay), for scale.
func BenchmarkLinkedPing(b *testing.B) {
	for _, d := range []time.Duration{-1, 50 * time.Microsecond, 2 * time.Millisecond} {
		name := "delay=" + d.String()
		if d < 0 {
			name = "bridge"
		}
		b.Run(name, func(b *testing.B) {
			if err := CheckLinks(); err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			n, err := New(ctx)
			if err != nil {
				b.Fatal(err)
			}
			defer n.Close()
			add := func(i int) (*Host, error) {
				if d < 0 {
					return n.AddHost(ctx, i, false, 9090)
				}
				return n.AddLinkedHost(ctx, i, Link{Delay: d})
			}
			x, err := add(0)
			if err != nil {
				b.Fatal(err)
			}
			y, err := add(1)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := MeasureLink(ctx, x, y, 10, 0); err != nil { // warm: ARP, learning
				b.Fatal(err)
			}
			cpu0, sw0 := processCPU(), n.LinkCounters().CPU
			b.ResetTimer()
			st, err := MeasureLink(ctx, x, y, b.N, 0)
			b.StopTimer()
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(processCPU()-cpu0)/float64(time.Microsecond)/float64(b.N), "cpu-µs/op")
			b.ReportMetric(float64(n.LinkCounters().CPU-sw0)/float64(time.Microsecond)/float64(b.N), "switch-cpu-µs/op")
			b.ReportMetric(float64(st.RTT(0.5))/float64(time.Microsecond), "rtt-µs")
		})
	}
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
