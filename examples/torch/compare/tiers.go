package main

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"time"

	"github.com/pspnode/pspnode/internal/netns"
)

// tier is one kind of wide-area link: every worker's access link has its
// delay (each way) and rate (each way), so that the TCP round trip between
// two workers is four delays plus forwarding (netns.Link).
type tier struct {
	Name string
	Link netns.Link
	// RTT is the round trip asked between two workers; RateBits the rate
	// in bits per second.
	RTT      time.Duration
	RateBits float64
	// What published emulations call it.
	About string
}

// tiers are the link tiers, in the order they run. Each link's delay is a
// quarter of the round trip asked.
var tiers = []tier{
	{Name: "lan", Link: netns.Link{Delay: 50 * time.Microsecond, Rate: 1e9 / 8}, RTT: 200 * time.Microsecond, RateBits: 1e9,
		About: "one data centre"},
	{Name: "region", Link: netns.Link{Delay: 5 * time.Millisecond, Rate: 1e9 / 8}, RTT: 20 * time.Millisecond, RateBits: 1e9,
		About: "one region (published emulations: about 10 ms one way, 1–2 Gbit/s)"},
	{Name: "continent", Link: netns.Link{Delay: 17500 * time.Microsecond, Rate: 400e6 / 8}, RTT: 70 * time.Millisecond, RateBits: 400e6,
		About: "across a continent (published: 67–143 ms, 0.4–0.8 Gbit/s)"},
	{Name: "consumer", Link: netns.Link{Delay: 7500 * time.Microsecond, Rate: 100e6 / 8}, RTT: 30 * time.Millisecond, RateBits: 100e6,
		About: "home connections (published: 100 Mbit/s down, 10–20 up; here 100 each way)"},
}

func tierNamed(name string) (tier, bool) {
	for _, t := range tiers {
		if t.Name == name {
			return t, true
		}
	}
	return tier{}, false
}

func tierNames() string {
	var s []string
	for _, t := range tiers {
		s = append(s, t.Name)
	}
	return strings.Join(s, ",")
}

// probe is what MeasureLink found on one tier, before any run on it.
type probe struct {
	Tier          string  `json:"tier"`
	AskedRTTms    float64 `json:"asked_rtt_ms"`
	AskedRateMbit float64 `json:"asked_rate_mbit_s"`
	MinRTTms      float64 `json:"rtt_min_ms"`
	MedianRTTms   float64 `json:"rtt_median_ms"`
	P90RTTms      float64 `json:"rtt_p90_ms"`
	RateMbit      float64 `json:"rate_mbit_s"`
	RateAllMbit   float64 `json:"rate_whole_transfer_mbit_s"`
	BulkMB        float64 `json:"bulk_mb"`
	// SwitchCPU is the switch thread's CPU during the measurement (the
	// receiving kernels' work in its TAP writes included); AvgFrame the
	// mean size of the frames it carried (offload bursts make it larger
	// than the MTU).
	SwitchCPU float64 `json:"switch_cpu_s"`
	AvgFrame  float64 `json:"avg_frame_bytes"`
	Load      float64 `json:"load_average"`
}

// measure builds two workers on tier t and measures their link: 50 TCP
// round trips and a bulk transfer of about 1.5 s at the tier's rate.
func measure(ctx context.Context, t tier) (probe, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	n, err := netns.New(ctx)
	if err != nil {
		return probe{}, err
	}
	defer n.Close()
	a, err := n.AddLinkedHost(ctx, 0, t.Link)
	if err != nil {
		return probe{}, err
	}
	b, err := n.AddLinkedHost(ctx, 1, t.Link)
	if err != nil {
		return probe{}, err
	}
	bulk := min(max(int64(t.Link.Rate*1.5), 8<<20), 160<<20)
	cpu0 := n.LinkCounters().CPU
	st, err := netns.MeasureLink(ctx, a, b, 50, bulk)
	if err != nil {
		return probe{}, fmt.Errorf("tier %s: %w", t.Name, err)
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	return probe{Tier: t.Name, AskedRTTms: ms(t.RTT), AskedRateMbit: t.RateBits / 1e6,
		MinRTTms: ms(st.RTT(0)), MedianRTTms: ms(st.RTT(0.5)), P90RTTms: ms(st.RTT(0.9)),
		RateMbit: st.Rate * 8 / 1e6, RateAllMbit: st.RateAll * 8 / 1e6, BulkMB: float64(bulk) / 1e6,
		SwitchCPU: (n.LinkCounters().CPU - cpu0).Seconds(), AvgFrame: avgFrame(n.LinkCounters()), Load: loadAverage()}, nil
}

func (p probe) String() string {
	return fmt.Sprintf("%s: round trip %.2f ms median (min %.2f, p90 %.2f; asked %.1f), %.0f Mbit/s (asked %.0f; whole transfer %.0f), switch %.2f CPU-s for %.0f MB (frames of %.0f B on average)",
		p.Tier, p.MedianRTTms, p.MinRTTms, p.P90RTTms, p.AskedRTTms, p.RateMbit, p.AskedRateMbit, p.RateAllMbit, p.SwitchCPU, p.BulkMB, p.AvgFrame)
}

func avgFrame(c netns.LinkCounters) float64 {
	if c.Frames == 0 {
		return 0
	}
	return float64(c.Bytes) / float64(c.Frames)
}

// selfCPU is this process's user and system CPU seconds: the emulated
// links' switch runs in it, and the harness does little else.
func selfCPU() float64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}
