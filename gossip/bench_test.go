package gossip

import (
	"math/rand/v2"
	"testing"
)

// Benchmarks for MNIST logistic regression (7850 parameters):
//
//	go test -bench . -run '^$' ./gossip/
func benchEncodings() []Encoding {
	return []Encoding{EncodingDense32, EncodingDense16, EncodingTopK32, EncodingTopK16}
}

func BenchmarkEncode(b *testing.B) {
	for _, enc := range benchEncodings() {
		b.Run(enc.String(), func(b *testing.B) {
			delta := f32s(gradient(rand.New(rand.NewPCG(1, 2)), mnistParams))
			e, _ := NewEncoder(mnistParams, enc, 0.1, 1e4)
			var size int
			b.ReportAllocs()
			for b.Loop() {
				u, err := e.Encode(delta)
				if err != nil {
					b.Fatal(err)
				}
				u.Sender = testSender
				out, err := EncodeUpdate(nil, u)
				if err != nil {
					b.Fatal(err)
				}
				size = len(out)
			}
			b.ReportMetric(float64(size), "bytes/update")
		})
	}
}

func BenchmarkDecodeValidate(b *testing.B) {
	lim := Limits{MaxMessageSize: MaxEncodedSize(mnistParams), ParamCount: mnistParams, ModelID: 7, MaxAbsValue: 1e4, MaxStepAhead: 1 << 20}
	for _, enc := range benchEncodings() {
		b.Run(enc.String(), func(b *testing.B) {
			delta := gradient(rand.New(rand.NewPCG(1, 2)), mnistParams)
			e, _ := NewEncoder(mnistParams, enc, 0.1, 1e4)
			data, _ := encodeDelta(b, e, delta, 1)
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Validate(data, testSender, 0, lim); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkApply(b *testing.B) {
	for _, enc := range benchEncodings() {
		b.Run(enc.String(), func(b *testing.B) {
			delta := gradient(rand.New(rand.NewPCG(1, 2)), mnistParams)
			e, _ := NewEncoder(mnistParams, enc, 0.1, 1e4)
			data, _ := encodeDelta(b, e, delta, 1)
			u, err := DecodeUpdate(data)
			if err != nil {
				b.Fatal(err)
			}
			w := make([]float32, mnistParams)
			for b.Loop() {
				if err := u.AddTo(w, 1); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
