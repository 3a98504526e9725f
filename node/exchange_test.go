package node

import (
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"gonum.org/v1/gonum/floats"

	"github.com/pspnode/pspnode/gossip"
	"github.com/pspnode/pspnode/internal/builtin"
	"github.com/pspnode/pspnode/internal/memnet"
	"github.com/pspnode/pspnode/internal/syncbuf"
	"github.com/pspnode/pspnode/internal/vclock"
	"github.com/pspnode/pspnode/internal/wire"
	"github.com/pspnode/pspnode/model"
	"github.com/pspnode/pspnode/node/exchange"
)

// newTestTrainer is a linreg task over 1-dimensional synthetic data whose
// parameters start at init (2 parameters: w and b).
func newTestTrainer(t testing.TB, init []float64) *builtin.ModelTask {
	t.Helper()
	ds := &model.Dataset{Name: "tiny", Dim: 1, X: []float64{0, 1, 2, 3}, Targets: []float64{0, 1, 2, 3}}
	m, err := model.New("linreg", 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := model.NewSGD(m, ds, init, model.DefaultSGDConfig())
	if err != nil {
		t.Fatal(err)
	}
	return builtin.NewModelTask(tr, nil, builtin.TimeModel{}, 1)
}

// Epidemic nodes train over the exchange protocol alone: no GossipSub
// topic, each node's models reach peers and are averaged in, and the
// models agree with each other far better than with where they started.
func TestEpidemicNodesTrain(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		mn := memnet.New(0)
		t.Cleanup(func() { _ = mn.Close() })
		nodes := buildTestNodesWith(t, 6, "pssp:2:2", 0.01, memHosts(t, mn), func(c *nodeSetup) {
			c.Exchange.Spec = exchange.Spec{Kind: exchange.Epidemic, S: 2}
			c.Genesis = exampleGenesis // one lineage from the start, as a testnet's
		})
		start := nodes[0].Model().Params()
		ctx, cancel := context.WithCancel(t.Context())
		wait := runAll(t, ctx, nodes)
		if !waitFor(30*time.Second, func() bool { return minStep(nodes) >= 40 }) {
			t.Errorf("not every node reached step 40: lowest %d", minStep(nodes))
		}
		cancel()
		wait()
		var params [][]float64
		for _, nd := range nodes {
			if nd.Gossip() != nil {
				t.Errorf("node %s joined the gossip topic", nd.ID())
			}
			st, tr := nd.exchangeStats(), nd.Traffic()
			if st.Sent == 0 || st.Received == 0 || st.Averaged == 0 || len(st.Rejected) != 0 {
				t.Errorf("node %s: %+v", nd.ID(), st)
			}
			if tr.Class("exchange").InBytes == 0 || tr.Class("gossip").InBytes != 0 {
				t.Errorf("node %s traffic: %+v", nd.ID(), tr.ByProtocol)
			}
			if s := nd.Status(); s.UpdatesReceived != st.Received || s.Exchange == nil || s.Exchange.Exchange != "epidemic:2" {
				t.Errorf("node %s status: %d received, exchange %+v", nd.ID(), s.UpdatesReceived, s.Exchange)
			}
			params = append(params, nd.Model().Params())
		}
		var spread, moved float64
		for i := range params {
			moved = max(moved, floats.Distance(params[i], start, 2))
			for j := range i {
				spread = max(spread, floats.Distance(params[i], params[j], 2))
			}
		}
		if !(spread < moved/4) {
			t.Errorf("models %v apart after moving %v from the start: they do not average", spread, moved)
		}
	})
}

// A job whose nodes disagree on the exchange says so on both sides: the
// epidemic node's models are refused with exchange_mismatch, and each
// side logs a warning that names --exchange.
func TestExchangeMismatchIsRefused(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		var logs syncbuf.Buffer
		log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
		mn := memnet.New(0)
		t.Cleanup(func() { _ = mn.Close() })
		i := 0
		nodes := buildTestNodesWith(t, 2, "asp", 0.01, memHosts(t, mn), func(c *nodeSetup) {
			if i == 0 {
				c.Exchange.Spec = exchange.Spec{Kind: exchange.Epidemic, S: 1}
			}
			c.opts = append(c.opts, WithLogger(log))
			i++
		})
		epi, gos := nodes[0], nodes[1]
		ctx, cancel := context.WithCancel(t.Context())
		wait := runAll(t, ctx, nodes)
		ok := waitFor(10*time.Second, func() bool {
			return epi.exchangeStats().SendFailed["exchange_mismatch"] > 0 && gos.exchangeStats().Declined[string(wire.ReasonExchangeMismatch)] > 0
		})
		cancel()
		wait()
		if !ok {
			t.Fatalf("no mismatch counted: epidemic %+v, gossip %+v", epi.exchangeStats(), gos.exchangeStats())
		}
		if st := gos.exchangeStats(); st.Received != 0 {
			t.Errorf("the gossip node took %d models", st.Received)
		}
		out := logs.String()
		if strings.Count(out, "must agree on --exchange") < 2 || !strings.Contains(out, "peer_exchange=gossip") || !strings.Contains(out, "peer_exchange=epidemic") {
			t.Errorf("logs do not name the mismatch on both sides:\n%s", out)
		}
	})
}

// An offer is read within its cap, and each block's head is checked
// before its values are read: a peer announcing an offer over the cap, or
// a block of another size than the offer's, gets its stream reset and is
// counted, and the node takes nothing of it.
func TestExchangeRefusesMalformed(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		nodes := epidemicPair(t)
		a, b := nodes[0], nodes[1]
		n := b.model.NumParams()
		raw := func(data []byte) {
			s, err := a.h.NewStream(t.Context(), b.ID(), wire.ExchangeProtocol(a.cfg.Job))
			if err != nil {
				t.Fatal(err)
			}
			_, _ = s.Write(data)
			_ = s.CloseWrite()
			_, _ = io.Copy(io.Discard, s)
			_ = s.Close()
		}
		big := binary.AppendUvarint(nil, wire.OfferLen+1)
		raw(append(big, make([]byte, wire.OfferLen+1)...))
		if !waitFor(time.Second, func() bool { return b.exchangeStats().Rejected[string(gossip.ReasonMalformed)] == 1 }) {
			t.Errorf("an oversized offer not counted: %+v", b.exchangeStats())
		}
		// b has not stepped: an offer of a good model is declined before its
		// bytes, for want of a model to judge it by.
		o := wire.Offer{Kind: byte(exchange.Epidemic), Encoding: wire.EncodingFloat32, Step: 1, ModelID: b.model.ModelID(), N: uint32(n),
			Block: wire.ExchangeBlock, Count: uint32(wire.Blocks(n))}
		raw(wire.AppendOffer(nil, o))
		if !waitFor(time.Second, func() bool { return b.exchangeStats().Declined[string(wire.ReasonNoModel)] == 1 }) {
			t.Errorf("an offer before the first step not declined: %+v", b.exchangeStats())
		}
		o.N++
		raw(wire.AppendOffer(nil, o))
		if !waitFor(time.Second, func() bool { return b.exchangeStats().Declined[string(gossip.ReasonWrongLength)] == 1 }) {
			t.Errorf("an offer of the wrong length not declined: %+v", b.exchangeStats())
		}
		if st := b.exchangeStats(); st.Received != 0 || st.Averaged != 0 {
			t.Errorf("b took %+v", st)
		}
	})
}

// epidemicPair is two epidemic:1 nodes on a memnet, in the caller's
// bubble, not running.
func epidemicPair(t *testing.T) []*Node {
	t.Helper()
	mn := memnet.New(0)
	t.Cleanup(func() { _ = mn.Close() })
	return buildTestNodesWith(t, 2, "asp", 0.01, memHosts(t, mn), func(c *nodeSetup) {
		c.Exchange.Spec = exchange.Spec{Kind: exchange.Epidemic, S: 1}
	})
}
