package node

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pspnode/pspnode/internal/memnet"
	"github.com/pspnode/pspnode/internal/vclock"
	"github.com/pspnode/pspnode/internal/wire"
	"github.com/pspnode/pspnode/node/status"
)

// A joiner holds the peer that gave it the model to other peers' copies:
// two witnesses that agree outvote a giver whose model is made up (within
// the exchange's bound, so every block is well formed), and the model
// comes again from the others; one witness alone, or witnesses that
// disagree, outvote nobody; peers whose models differ as honest peers'
// do agree.
func TestFetchedModelCrossChecked(t *testing.T) {
	const liar = 15 // a made-up model: every value 15 times the job's (within the bound of 1e4)
	cases := []struct {
		name     string
		muls     []float32 // each peer's model, in the order the joiner asks them: value(i) × mul
		want     float32   // the model the joiner ends with: value(i) × want
		outvoted float64
	}{
		{"liar first, two honest witnesses", []float32{liar, 1, 1}, 1, 1},
		{"liar first, honest witnesses a little apart", []float32{liar, 1, 1.1}, 1, 1},
		{"honest first, a liar and an honest witness", []float32{1, liar, 1}, 1, 0},
		{"honest first, two liars that agree", []float32{1, liar, liar}, 1 /* outvoted, then the liars give it */, 1},
		{"liar first, one witness", []float32{liar, 1}, liar, 0},
		{"liar first, witnesses that disagree", []float32{liar, 1, -3}, liar, 0},
		{"honest peers a little apart", []float32{1, 1.05, 0.97}, 1, 0},
	}
	saved := fetchPeers
	t.Cleanup(func() { fetchPeers = saved })
	fetchPeers = 1 // the first peer gives the model
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			vclock.Test(t, func(t *testing.T) {
				mn := memnet.New(0)
				t.Cleanup(func() { _ = mn.Close() })
				n := 1000 // one block: the first peer gives it all
				mk := memHosts(t, mn)
				var peers []peer.ID
				var hosts []host.Host
				for _, mul := range tc.muls {
					h := mk()
					t.Cleanup(func() { _ = h.Close() })
					sv := &wire.ModelServer{Life: t.Context(), Timeout: time.Hour, Log: slog.New(slog.DiscardHandler),
						Source: &servedModel{shape: wire.ModelShape{ID: 5, N: n}, stallAt: -1, mul: mul}}
					h.SetStreamHandler(wire.ModelProtocol("crosscheck"), sv.Serve)
					hosts, peers = append(hosts, h), append(peers, h.ID())
				}
				cfg := DefaultConfig()
				cfg.Job, cfg.Listen = "crosscheck", []string{"/ip4/127.0.0.1/tcp/0"}
				c, err := New(context.Background(), cfg, WithHost(mk()), WithTask(&vecTask{vecModel{p: make([]float64, n)}}))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = c.Close() })
				for _, h := range hosts {
					if err := c.h.Connect(t.Context(), peer.AddrInfo{ID: h.ID(), Addrs: h.Addrs()}); err != nil {
						t.Fatal(err)
					}
				}
				v := c.fetchJobModel(t.Context(), jobView{adopt: 9}, peers, true, false, nil)
				if v.model == nil {
					t.Fatalf("no model: %v", v.fetchErr)
				}
				if tc.name == "honest first, two liars that agree" {
					// Two identities that agree outvote one: a few
					// identities are an honest majority's matter, not
					// one peer's. The model is theirs.
					tc.want = liar
				}
				for i, x := range v.model {
					if x != value(i)*tc.want {
						t.Fatalf("value %d is %v, want %v (value × %v)", i, x, value(i)*tc.want, tc.want)
					}
				}
				got := testutil.ToFloat64(c.m.Hostile.WithLabelValues(status.KindModelOutvoted))
				if got != tc.outvoted {
					t.Errorf("model_outvoted %v, want %v", got, tc.outvoted)
				}
			})
		})
	}
}
