package node

import (
	"context"
	"io"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/pspnode/pspnode/internal/vclock"
	"github.com/pspnode/pspnode/internal/wire"
	"github.com/pspnode/pspnode/node/status"
)

// families gathers a registry's metric families by name.
func families(t *testing.T, nd *Node) map[string]*dto.MetricFamily {
	t.Helper()
	mfs, err := nd.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]*dto.MetricFamily, len(mfs))
	for _, mf := range mfs {
		out[mf.GetName()] = mf
	}
	return out
}

// A malformed model request is counted as one, not as a malformed step
// request, and the stream is reset.
func TestModelRequestMalformedCounted(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		nodes := memNodes(t, 2, "pssp:1:1", 0.001)
		a, b := nodes[0], nodes[1]
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		s, err := a.Host().NewStream(ctx, b.ID(), wire.ModelProtocol(a.cfg.Job))
		if err != nil {
			t.Fatal(err)
		}
		if err := wire.WriteFrame(s, []byte{wire.Version + 1}); err != nil {
			t.Fatal(err)
		}
		_ = s.CloseWrite()
		if _, err := io.ReadAll(s); err == nil {
			t.Fatal("a model request with the wrong version was answered")
		}
		if got := status.CounterValue(b.m.ModelBad); got != 1 {
			t.Errorf("malformed model requests counted %v, want 1", got)
		}
		if got := status.CounterValue(b.m.Malformed); got != 0 {
			t.Errorf("a malformed model request counted as %v malformed step requests", got)
		}
	})
}
