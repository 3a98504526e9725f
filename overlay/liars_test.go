package overlay

import (
	"math"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/test"

	"github.com/pspnode/pspnode/internal/vclock"
)

// Peers that lie about the population (reporting 1e9, the largest a node
// accepts) and report more often than the honest ones, so that their
// reports are always among the freshest, do not move the estimate by more
// than a quarter: every peer's latest report is one vote, and reports far
// from the others' median do not count.
func TestReportsResistLiars(t *testing.T) {
	for _, tc := range []struct {
		name           string
		honest, liars  int
		truth, maxRErr float64
	}{
		{"one liar beside three honest nodes", 3, 1, 4, 0.25},
		{"10 % liars among 100", 90, 10, 100, 0.25},
		{"30 % liars among 100", 70, 30, 100, 0.25},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := bareOverlay(t, DefaultConfig())
			now := time.Now()
			o.mu.Lock()
			for i := range tc.honest {
				// Honest reports within 5 % of the truth, a few seconds old.
				n := tc.truth * (1 + 0.05*math.Sin(float64(i)))
				o.reports[test.RandPeerIDFatal(t)] = report{n: n, at: now.Add(-time.Duration(1+i%20) * time.Second)}
			}
			for range tc.liars {
				o.reports[test.RandPeerIDFatal(t)] = report{n: 1e9, at: now}
			}
			o.mu.Unlock()
			est, _, err := o.Estimate()
			if err != nil {
				t.Fatal(err)
			}
			if rerr := math.Abs(est-tc.truth) / tc.truth; rerr > tc.maxRErr {
				t.Errorf("estimate %.4g with %d liars among %d: %.0f %% off, want at most %.0f %%", est, tc.liars, tc.honest+tc.liars, 100*rerr, 100*tc.maxRErr)
			}
			if k := len(o.PeerReports()); k != tc.honest+tc.liars {
				t.Errorf("%d peer reports, want %d (one per peer)", k, tc.honest+tc.liars)
			}
		})
	}
}

// The node's own estimate votes in the band's median: one honest report
// beside one liar's does not let the liar's set it.
func TestFuseReportsOwnEstimateVotes(t *testing.T) {
	n, _, err := fuseReports(3, 0.5, true, []float64{3.2, 1e9}, 1)
	if err != nil || n > 4 {
		t.Errorf("fused %v, %v: want about 3", n, err)
	}
	// Honest reports a little apart all count.
	reps := []float64{80, 90, 110, 120, 130}
	mean, _ := trimmedMean(reps)
	n, _, err = fuseReports(100, 5, true, reps, 1)
	if want := (100 + 5*mean) / 6; err != nil || math.Abs(n-want) > 1e-9 {
		t.Errorf("fused %v, %v: want %v (every report counts)", n, err, want)
	}
}

// Liars that are most of the first peers to report do not set the
// estimate: until half the peers the node knows have reported, its own
// estimate holds the band's median. Once they have, the reports do.
func TestFuseReportsEarlyLiars(t *testing.T) {
	reps := []float64{1e9, 1e9, 1e9, 1e9, 1e9, 1e9, 1e9, 1e9, 98, 103, 101, 99} // 8 liars, 4 honest, of 99 known
	n, _, err := fuseReports(100, 10, true, reps, localVotes(len(reps), 99))
	if err != nil || math.Abs(n-100) > 5 {
		t.Errorf("fused %v, %v: want about 100", n, err)
	}
	if got := localVotes(len(reps), 99); got != 38 {
		t.Errorf("own votes beside 12 of 99 peers' reports: %d, want 38", got)
	}
	if got := localVotes(60, 99); got != 1 {
		t.Errorf("own votes beside 60 of 99 peers' reports: %d, want 1", got)
	}
}

// PeerReports gives one report per peer, its latest, with how long the
// peer has been reporting (for a peer the overlay has no first-hand
// record of): a peer that reports again keeps its standing, one silent
// for ReportMaxAge starts again.
func TestPeerReportsStanding(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		o := bareOverlay(t, DefaultConfig())
		p := test.RandPeerIDFatal(t)
		o.ObserveEstimate(p, 10)
		time.Sleep(o.cfg.ReportMaxAge / 2)
		o.ObserveEstimate(p, 12)
		time.Sleep(o.cfg.ReportMaxAge / 2)
		o.ObserveEstimate(p, 14)
		r := o.PeerReports()
		if len(r) != 1 || r[0].N != 14 || r[0].For != o.cfg.ReportMaxAge {
			t.Errorf("reports %+v: want one, 14, reporting for %v", r, o.cfg.ReportMaxAge)
		}
		time.Sleep(o.cfg.ReportMaxAge + time.Second)
		if r := o.PeerReports(); len(r) != 0 {
			t.Errorf("a report older than ReportMaxAge counts: %+v", r)
		}
		o.ObserveEstimate(p, 16)
		if r := o.PeerReports(); len(r) != 1 || r[0].For != 0 {
			t.Errorf("a peer back after a silence kept its standing: %+v", r)
		}
	})
}
