package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/pspnode/pspnode/internal/vclock"
	"github.com/pspnode/pspnode/node/status"
)

// Every byte one node writes on a stream another reads: over the whole
// network each class's bytes in and out agree, GossipSub carries more than
// the update payloads it delivers, and /metrics exports the counts.
func TestTrafficCountsStreams(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		nodes := memNodes(t, 4, "pssp:2:1", 0.01, nil)
		ctx, cancel := context.WithCancel(t.Context())
		wait := runAll(t, ctx, nodes)
		if !waitFor(20*time.Second, func() bool { return minStep(nodes) >= 20 }) {
			t.Fatalf("nodes did not train: lowest step %d", minStep(nodes))
		}
		cancel()
		wait()
		var in, out [status.NumClasses]uint64
		for _, nd := range nodes {
			tr := nd.Traffic()
			for c, name := range status.Classes {
				in[c] += tr.Class(name).InBytes
				out[c] += tr.Class(name).OutBytes
			}
			if tr.Class("gossip").InBytes == 0 || tr.Class("step").InBytes == 0 || tr.Class("dht").InBytes == 0 {
				t.Errorf("node %s: no gossip, step or DHT bytes in: %+v", nd.ID(), tr.ByProtocol)
			}
			if !(tr.GossipAmplification >= 1) || tr.GossipPayloadBytes == 0 {
				t.Errorf("node %s: gossip amplification %v over %d payload bytes; want >= 1", nd.ID(), tr.GossipAmplification, tr.GossipPayloadBytes)
			}
			if tr.InBytesPerStep <= 0 || tr.InBytesPerS <= 0 {
				t.Errorf("node %s: rates %+v", nd.ID(), tr)
			}
			// /metrics carries the same counts.
			mfs, err := nd.Registry().Gather()
			if err != nil {
				t.Fatal(err)
			}
			var total float64
			for _, mf := range mfs {
				if mf.GetName() != "psp_traffic_bytes_total" {
					continue
				}
				for _, m := range mf.GetMetric() {
					for _, l := range m.GetLabel() {
						if l.GetName() == "direction" && l.GetValue() == "in" {
							total += m.GetCounter().GetValue()
						}
					}
				}
			}
			if total < float64(tr.InBytes) {
				t.Errorf("node %s: /metrics counts %v bytes in, Traffic %d", nd.ID(), total, tr.InBytes)
			}
		}
		for c, name := range status.Classes {
			// A write whose stream is reset before the reader reads it
			// counts out but never in.
			if in[c] > out[c] || float64(in[c]) < 0.9*float64(out[c]) {
				t.Errorf("%s: %d bytes in, %d out over the network", name, in[c], out[c])
			}
		}
	})
}
