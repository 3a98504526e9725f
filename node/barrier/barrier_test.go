package barrier

import (
	"testing"

	"github.com/pspnode/pspnode/psp"
)

// The zero ScreenConfig turns screening off (testnet --no-screen relies on
// it); psp's default turns it on.
func TestScreenFor(t *testing.T) {
	if s := screenFor(psp.ScreenConfig{}); s != nil {
		t.Errorf("zero config: screen %v, want none", s)
	}
	if s := screenFor(psp.DefaultScreenConfig()); s == nil {
		t.Error("default config: no screen")
	}
}
