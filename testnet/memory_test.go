package testnet

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/pspnode/pspnode/testnet/plan"
)

// A run whose estimate does not fit in the machine's memory is refused
// before any node is built, naming the way out; Force runs it.
func TestRunRefusesTooLarge(t *testing.T) {
	defer func(f func() float64) { availableMemory = f }(availableMemory)
	availableMemory = func() float64 { return 1 << 30 }
	cfg := plan.DefaultConfig()
	cfg.Nodes, cfg.Model, cfg.Data = 400, "logreg", "synthetic"
	var told *plan.Estimate
	cfg.Estimated = func(e plan.Estimate) { told = &e }
	_, err := Run(context.Background(), cfg)
	var tl *plan.ErrTooLarge
	if !errors.As(err, &tl) || !strings.Contains(err.Error(), "--force") || told == nil || told.RSSBytes != tl.Estimate.RSSBytes {
		t.Fatalf("Run: %v (told %+v)", err, told)
	}
	// With Force, the refusal is gone: Run goes on to its next check (the
	// virtual clock needs a bubble), which is as far as this test goes.
	cfg.Force = true
	if _, err := Run(context.Background(), cfg); errors.As(err, &tl) || err == nil || !strings.Contains(err.Error(), "bubble") {
		t.Fatalf("forced Run: %v", err)
	}
}
