package exchange

import (
	"fmt"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/internal/wire"
)

// BenchmarkEpidemicStep measures what an epidemic node's data path costs
// per step for a model of 10 M parameters (40 MB), in memory passes: the
// time of a copy of the model into a warm buffer, measured in the same
// run (passes/op). The parts, apart from any transport:
//
//   - step: the trainer's model after its step and a round of S = 2
//     models averaged in (StepMerge32: one pass over the model, the
//     reference and the round's sum), which also notes the step's norms;
//
//   - receive: one model taken in, block by block (checked, its distance
//     measured, added to the round's sum);
//
//   - send: one model read out of the reference block by block, as a
//     send does (the transport's encryption and copies excluded).
//
//     go test -run '^$' -bench '^BenchmarkEpidemicStep$' -benchtime 20x ./node/exchange/
func BenchmarkEpidemicStep(b *testing.B) {
	const params, s = 10_000_000, 2
	ex, _ := exchangeFor(b, params, s, 0)
	x := make([]float32, params)
	for i := range x {
		x[i] = float32(i%7) * 1e-3
	}
	ex.setRef(append([]float32(nil), x...)...)
	models := make([][]float32, s)
	for i := range models {
		models[i] = make([]float32, params)
		for j := range models[i] {
			models[i][j] = x[j] + float32(i+1)*1e-4
		}
	}
	senders := make([]peer.ID, s)
	for i := range senders {
		senders[i] = peer.ID(fmt.Sprintf("peer-%d", i))
	}
	warm := make([]float32, params)
	pass := func() time.Duration {
		t := time.Now()
		copy(warm, x)
		return time.Since(t)
	}
	pass()
	// run reports part's time over the median of a few copies' times.
	run := func(b *testing.B, setup, part func()) {
		var parts, passes time.Duration
		for b.Loop() {
			setup()
			passes += pass()
			t := time.Now()
			part()
			parts += time.Since(t)
		}
		b.ReportMetric(float64(parts)/float64(passes), "passes/op")
	}
	receive := func(i int) {
		ex.spacing = 0
		if r := takeModel(ex, senders[i], Epidemic, 1, models[i]); r != "" {
			b.Fatal(r)
		}
	}
	b.Run("step", func(b *testing.B) {
		run(b, func() {
			for i := range senders {
				receive(i)
			}
		}, func() { ex.Merge(1, x) })
	})
	b.Run("receive", func(b *testing.B) {
		run(b, func() { ex.Merge(1, x) }, func() { receive(0) })
	})
	b.Run("send", func(b *testing.B) {
		buf := make([]float32, wire.ExchangeBlock)
		run(b, func() {}, func() {
			for blk := range wire.Blocks(params) {
				lo, hi := wire.BlockRange(blk, params)
				ex.ReadModel(lo, hi, buf[:hi-lo])
			}
		})
	})
}
