package netsetup

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Refusals are logged RefusedLogBurst times per RefusedLogEvery; the rest
// of an interval is one summary line, with its count, at the first
// refusal after the interval.
func TestRefusedWarningsRateLimited(t *testing.T) {
	var buf bytes.Buffer
	g := newGate(nil, slog.New(slog.NewTextHandler(&buf, nil)), prometheus.NewRegistry())
	t0 := time.Unix(1000, 0)
	for i := range RefusedLogBurst + 7 {
		reason := refusedHandshake
		if i%4 == 3 {
			reason = refusedNotAllowed
		}
		if got, want := g.mayWarn(reason, t0.Add(time.Duration(i)*time.Millisecond)), i < RefusedLogBurst; got != want {
			t.Fatalf("refusal %d: may warn %v, want %v", i, got, want)
		}
	}
	if buf.Len() != 0 {
		t.Fatalf("summary logged within the interval: %s", buf.String())
	}
	if !g.mayWarn(refusedHandshake, t0.Add(RefusedLogEvery)) {
		t.Error("the first refusal of a new interval may not warn")
	}
	out := buf.String()
	if !strings.Contains(out, "refused 7 more connections in the last 10s") || !strings.Contains(out, "handshake=5") || !strings.Contains(out, "not_allowed=2") {
		t.Errorf("summary %q: want 7 more (5 handshake, 2 not_allowed) in the last 10s", out)
	}
	buf.Reset()
	if !g.mayWarn(refusedHandshake, t0.Add(3*RefusedLogEvery)) || buf.Len() != 0 {
		t.Errorf("an interval with nothing left out logged a summary: %q", buf.String())
	}
}
