package node

import (
	"strconv"
	"strings"
	"testing"

	"github.com/pspnode/pspnode/psp"
)

// A sampled barrier needs a sampler pool of at least β peers: with a
// smaller pool every check would silently fall back to an unweighted
// shuffle of all known peers. Validate names both numbers and the fix.
func TestValidatePoolHoldsBeta(t *testing.T) {
	for _, tc := range []struct {
		barrier string
		pool    int
		ok      bool
	}{
		{"pssp:100:4", 64, false},
		{"pbsp:65", 64, false},
		{"pdssp:70:1:3", 64, false},
		{"pssp:100:4", 100, true},
		{"pssp:10:4", 64, true},
		{"pbsp:64", 64, true},
		{"ssp:4", 1, true}, // global barriers do not sample
		{"asp", 1, true},
	} {
		cfg := DefaultConfig()
		cfg.Barrier = psp.MustParse(tc.barrier)
		cfg.Overlay.PoolSize = tc.pool
		err := cfg.Validate()
		if tc.ok {
			if err != nil {
				t.Errorf("%s, pool %d: %v", tc.barrier, tc.pool, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("%s, pool %d: accepted", tc.barrier, tc.pool)
			continue
		}
		beta := cfg.Barrier.Beta
		for _, want := range []string{"β = " + strconv.Itoa(beta), "holds " + strconv.Itoa(tc.pool), "Overlay.PoolSize to at least " + strconv.Itoa(beta)} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s, pool %d: error %q does not say %q", tc.barrier, tc.pool, err, want)
			}
		}
	}
}
