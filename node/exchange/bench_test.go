package exchange

import (
	"fmt"
	"io"
	"runtime"
	"testing"

	"github.com/libp2p/go-libp2p/core/peer"
)

// BenchmarkEpidemicStep counts the copies of the model an epidemic node
// makes in a step, apart from any transport, for a model of 65536
// parameters and S = 2:
//
//   - push: after the step, the model is read, kept as the distance
//     reference and encoded into the request, which is then written to
//     each of the S peers' streams (io.Discard here; wire.SendExchange writes
//     the same frame to a stream);
//   - merge: before the step, the S models received are averaged in;
//   - receive: one model taken in (validated, added to the sum).
//
// Reported: copies/op, the bytes the part allocates per op over the
// model's size in float64 (8 bytes a parameter: a float32 copy counts one
// half).
//
//	go test -run '^$' -bench '^BenchmarkEpidemicStep$' -benchmem ./node/exchange/
func BenchmarkEpidemicStep(b *testing.B) {
	const params, s = 1 << 16, 2
	ex, node := exchangeFor(b, params, s, 0)
	senders := make([]peer.ID, s)
	payloads := make([][]byte, s)
	for i := range senders {
		senders[i] = peer.ID(fmt.Sprintf("peer-%d", i))
		values := make([]float32, params)
		for j := range values {
			values[j] = float32(i + j%7)
		}
		payloads[i] = modelPayload(b, senders[i], 1, values)
	}
	receive := func(i int) {
		if r := ex.Accept(senders[i], payloads[i]); r != "" {
			b.Fatal(r)
		}
	}
	// measure runs part b.N times, setup before each, and reports the
	// bytes part allocated, in models.
	measure := func(b *testing.B, setup, part func()) {
		b.ReportAllocs()
		var before, after runtime.MemStats
		var bytes uint64
		for b.Loop() {
			setup()
			runtime.ReadMemStats(&before)
			part()
			runtime.ReadMemStats(&after)
			bytes += after.TotalAlloc - before.TotalAlloc
		}
		b.ReportMetric(float64(bytes)/float64(b.N)/float64(8*params), "copies/op")
	}
	b.Run("push", func(b *testing.B) {
		measure(b, func() {}, func() {
			p := node.model.Params() // as push reads a built-in task's model
			ex.mu.Lock()
			if ex.ref == nil {
				ex.ref = make([]float32, params)
			}
			for i, x := range p {
				ex.ref[i] = float32(x)
			}
			ex.mu.Unlock()
			req, ok := ex.request(1)
			if !ok {
				b.Fatal("nothing to send")
			}
			for range s {
				_, _ = io.Discard.Write(req.Frame)
			}
		})
	})
	b.Run("merge", func(b *testing.B) {
		measure(b, func() {
			for i := range senders {
				receive(i)
			}
		}, ex.Merge)
	})
	b.Run("receive", func(b *testing.B) {
		measure(b, ex.Merge, func() { receive(0) })
	})
}
