package testnet

import (
	"strings"
	"testing"
	"time"

	"github.com/pspnode/pspnode/node/exchange"
	"github.com/pspnode/pspnode/testnet/hostile"
	"github.com/pspnode/pspnode/testnet/plan"
	"github.com/pspnode/pspnode/testnet/report"
)

// attackConfig is a small run of linear regression over the epidemic
// exchange with one node of role r among 8.
func attackConfig(r plan.Role, d time.Duration) plan.Config {
	cfg := tinyConfig(8, d)
	cfg.Model = "linreg"
	cfg.Roles = []plan.RoleShare{{Role: r, Fraction: 0.125}}
	return cfg
}

// summary is res's printed summary.
func summary(res *report.Result) string {
	var sb strings.Builder
	res.PrintSummary(&sb)
	return sb.String()
}

// TestLineageHijackRole checks that a lineage-hijack node tells every
// honest node of its lineage, from hijackAfter on, and that the report
// accounts for every honest node's lineage. (Whether they follow it is the
// figure the role measures.)
func TestLineageHijackRole(t *testing.T) {
	res := runLogged(t, attackConfig(plan.LineageHijack, 20*time.Second))
	h := res.Hostile
	if h == nil || h.Lineage == nil || h.Nodes[string(plan.LineageHijack)] != 1 {
		t.Fatalf("hostile report %+v", h)
	}
	l := h.Lineage
	if l.OnJob+l.Hijacked+l.Other != h.HonestNodes || h.HonestNodes != 7 {
		t.Errorf("lineages %+v do not cover the %d honest nodes", *l, h.HonestNodes)
	}
	// Each second from hijackAfter (10 s in) the hijacker queries every
	// peer it knows.
	if l.QueriesSent < uint64(5*h.HonestNodes) {
		t.Errorf("%d hijacking queries answered in 10 s, want at least %d", l.QueriesSent, 5*h.HonestNodes)
	}
	if !strings.Contains(summary(res), "lineage hijack") {
		t.Error("summary has no lineage-hijack row")
	}
}

// TestJoinerWedgeRole checks that a joiner starts through the joiner-wedge
// node, asks it, and is reported apart from the honest nodes, whose step
// figures its claimed step must not reach.
func TestJoinerWedgeRole(t *testing.T) {
	res := runLogged(t, attackConfig(plan.JoinerWedge, 20*time.Second))
	h := res.Hostile
	if h == nil || h.Wedge == nil {
		t.Fatalf("hostile report %+v", h)
	}
	w := h.Wedge
	if w.Joiners != 1 || len(w.Probes) != 1 || w.RepliesSent == 0 {
		t.Fatalf("wedge figures %+v", *w)
	}
	if w.Probes[0].BarrierChecks == 0 {
		t.Errorf("the joiner through the wedge node made no barrier check: %+v", w.Probes[0])
	}
	if res.Steps.Max > 1e6 || res.LiveNodes != 7 || res.Joined != 0 {
		t.Errorf("the joiner is counted among the honest nodes: steps %+v, %d live, %d joined", res.Steps, res.LiveNodes, res.Joined)
	}
	if !strings.Contains(summary(res), "joiner wedge") {
		t.Error("summary has no joiner-wedge row")
	}
}

// TestDriftPoisonRole checks that a drift-poison node pushes models at the
// honest nodes and fits its distance to their bound: some pushes are
// refused for distance, and every push is accounted for. (Its distance
// grows only with the pushes taken, one per victim's average at most:
// it reaches the bound in 20 to 30 s.)
func TestDriftPoisonRole(t *testing.T) {
	res := runLogged(t, attackConfig(plan.DriftPoison, 40*time.Second))
	h := res.Hostile
	if h == nil || h.Drift == nil {
		t.Fatalf("hostile report %+v", h)
	}
	d := h.Drift
	if d.Pushes < 100 || d.ModelsFetched == 0 {
		t.Errorf("drift figures %+v: want at least 100 pushes in 40 s", *d)
	}
	if d.Taken+d.Distance+d.Rate+d.Other < d.Pushes {
		t.Errorf("drift figures %+v: pushes not accounted for", *d)
	}
	if d.Distance == 0 {
		t.Errorf("drift figures %+v: no push reached the distance bound", *d)
	}
	if !strings.Contains(summary(res), "drift poison") {
		t.Error("summary has no drift-poison row")
	}
}

// TestEstimateLiarRole checks that an estimate-liar node's lying queries
// are answered at about LiarQueryRate a second by every honest node, and
// that the honest nodes' population stays within a quarter of the truth
// beside it.
func TestEstimateLiarRole(t *testing.T) {
	cfg := tinyConfig(4, 10*time.Second)
	cfg.Roles = []plan.RoleShare{{Role: plan.EstimateLiar, Fraction: 0.25}} // 1 beside 3 honest
	res := runLogged(t, cfg)
	h := res.Hostile
	if h == nil || h.Nodes[string(plan.EstimateLiar)] != 1 {
		t.Fatalf("hostile report %+v", h)
	}
	if want := uint64(3 * hostile.LiarQueryRate * 10 / 2); h.LiarQueries < want {
		t.Errorf("%d lying queries answered, want at least %d", h.LiarQueries, want)
	}
	u := res.Population.Used
	if u == nil || u.Max > 10 || u.MedianRelError > 0.25 {
		t.Errorf("population used %+v: want at most 10, within 25 %%", u)
	}
	if !strings.Contains(summary(res), "estimate liars") {
		t.Error("summary has no estimate-liar row")
	}
}

// TestStreamHogRole checks that a stream-hog node holds idle step streams
// on the flood target from StreamHogPeers identities, and that the
// target's honest peers and fresh peers keep getting their step queries
// answered.
func TestStreamHogRole(t *testing.T) {
	cfg := tinyConfig(4, 10*time.Second)
	cfg.Roles = []plan.RoleShare{{Role: plan.StreamHog, Fraction: 0.25}}
	res := runLogged(t, cfg)
	h := res.Hostile
	if h == nil || h.Hogs == nil || h.Target == nil {
		t.Fatalf("hostile report %+v", h)
	}
	g := h.Hogs
	if g.Identities != hostile.StreamHogPeers || g.StreamsOpened < hostile.StreamHogPeers*8 {
		t.Errorf("hog figures %+v: want %d identities holding 8 streams each", *g, hostile.StreamHogPeers)
	}
	if g.FreshTried == 0 || g.FreshAnswered != g.FreshTried || g.TargetEvicted == 0 {
		t.Errorf("hog figures %+v: want every fresh peer answered, idle streams evicted", *g)
	}
	if res.Defences.StepQueriesFailed != 0 || h.Target.HeldLiveBy != h.Target.HonestPeers {
		t.Errorf("%d honest step queries failed; target held live by %d of %d", res.Defences.StepQueriesFailed, h.Target.HeldLiveBy, h.Target.HonestPeers)
	}
}

// TestConnAndLogHogRoles runs the conn-hog and log-flood roles on TCP
// loopback, each beside three honest nodes: fresh peers of the job still
// connect to the target and are answered, and the junk connections of
// log-flood leave a few warnings, not one each.
func TestConnAndLogHogRoles(t *testing.T) {
	for _, tc := range []struct {
		role    plan.Role
		private bool
	}{{plan.ConnHog, false}, {plan.LogFlood, true}} {
		t.Run(string(tc.role), func(t *testing.T) {
			cfg := tinyConfig(4, 10*time.Second)
			cfg.Clock, cfg.Transport, cfg.Private = plan.Real, "tcp", tc.private
			cfg.Roles = []plan.RoleShare{{Role: tc.role, Fraction: 0.25}}
			res := runLogged(t, cfg)
			h := res.Hostile
			if h == nil || h.Hogs == nil {
				t.Fatalf("hostile report %+v", h)
			}
			g := h.Hogs
			// Most fresh peers get in: on a loaded machine one try in a
			// few can outlast its 5 s deadline while the flood holds the
			// target's CPU (at a load of 10, 0 of the 1 try that ran
			// one at a time in the 10 s).
			if g.FreshTried == 0 || 2*g.FreshAnswered <= g.FreshTried {
				t.Errorf("hog figures %+v: want most fresh peers answered", *g)
			}
			switch tc.role {
			case plan.ConnHog:
				// The identities come up one by one: all 300 within
				// seconds on a quiet machine, a few dozen in the run's
				// 10 s on a loaded one (34 at a load of 12), so what is
				// asserted is that the attack ran (its half-open sockets,
				// some identities, the target holding their
				// connections beside its three honest peers'), not how
				// far it got.
				if g.Identities < 10 || g.HalfOpenSockets < hostile.ConnHogHalfOpen || g.TargetConnectionsMax < 3+10 {
					t.Errorf("hog figures %+v: want identities up, their connections held and %d half-open sockets", *g, hostile.ConnHogHalfOpen)
				}
			case plan.LogFlood:
				if g.JunkConnections < 1000 {
					t.Errorf("%d junk connections in 10 s", g.JunkConnections)
				}
				if res.LogWarnings.Lines > 20 {
					t.Errorf("%d warnings for %d junk connections", res.LogWarnings.Lines, g.JunkConnections)
				}
			}
		})
	}
}

// The defences against the three attacks that take a job through claims
// (each failed on the code the attacks were found on: every honest node
// on the hijacker's lineage at step 5 000 009; the joiner at the wedge's
// step, passing no barrier; R² −1.4e9 under the drift poisoner).
func TestOnePeerCannotTakeTheJob(t *testing.T) {
	t.Run("lineage hijack", func(t *testing.T) {
		res := runLogged(t, attackConfig(plan.LineageHijack, 10*time.Second))
		l := res.Hostile.Lineage
		if l == nil || l.Hijacked != 0 || l.OnJob != res.Hostile.HonestNodes || res.Steps.Max > 1e6 {
			t.Errorf("honest nodes on the hijacker's lineage: %+v; steps %+v", l, res.Steps)
		}
	})
	t.Run("joiner wedge", func(t *testing.T) {
		res := runLogged(t, attackConfig(plan.JoinerWedge, 20*time.Second))
		w := res.Hostile.Wedge
		if w == nil || len(w.Probes) != 1 {
			t.Fatalf("wedge figures %+v", w)
		}
		j := w.Probes[0]
		if float64(j.Step) > res.Steps.Max+100 || j.BarrierPasses == 0 {
			t.Errorf("the joiner through the wedge node: step %d (honest at most %.0f), %d passes in %d checks",
				j.Step, res.Steps.Max, j.BarrierPasses, j.BarrierChecks)
		}
	})
	t.Run("drift poison", func(t *testing.T) {
		cfg := attackConfig(plan.DriftPoison, 20*time.Second)
		cfg.Exchange = exchange.Spec{Kind: exchange.Epidemic, S: 4}
		res := runLogged(t, cfg)
		if res.Accuracy == nil || !(res.Accuracy.Final > 0.9) {
			t.Errorf("under a drift poisoner the honest fit is %+v, want R² above 0.9 (clean about 0.98)", res.Accuracy)
		}
	})
}

// The defences against a few identities that take a job through claims,
// each failed on the code before them: as many drift poisoners as honest
// nodes took the honest loss to 6e6, as many identities as honest nodes
// (three against three) claiming an older lineage took every honest node
// at each of their rounds, two liars reporting a population of 1e9
// beside three honest nodes set every honest node's at 5e8, and one of
// three joiners that met two joiner-wedge nodes first took their step
// (all four that met three of them).
func TestFewIdentitiesCannotTakeTheJob(t *testing.T) {
	t.Run("lineage hijack, k = h = 3", func(t *testing.T) {
		cfg := attackConfig(plan.LineageHijack, 40*time.Second) // the campaign from 15 s: two rounds
		cfg.Nodes, cfg.Roles = 6, []plan.RoleShare{{Role: plan.LineageHijack, Fraction: 0.5}}
		res := runLogged(t, cfg)
		l := res.Hostile.Lineage
		if l == nil || res.Hostile.Nodes[string(plan.LineageHijack)] != 3 || l.QueriesSent == 0 {
			t.Fatalf("hostile report %+v", res.Hostile)
		}
		if l.Hijacked != 0 || l.OnJob != res.Hostile.HonestNodes || l.Resets != 0 || res.Steps.Max > 1e6 {
			t.Errorf("three hijackers against three honest nodes: %+v; steps %+v", *l, res.Steps)
		}
	})
	// A joiner through each wedge node alone, and one through all of
	// them. At k = h = 3 every joiner took the wedges' step before joins
	// that split into camps asked every known peer and waited.
	for _, tc := range []struct {
		name     string
		nodes, k int
		share    float64
		d        time.Duration
		scale    float64
	}{
		{"joiners through wedge nodes, k = 2, h = 3", 5, 2, 0.4, 30 * time.Second, 0.05},
		{"joiners through wedge nodes, k = h = 3", 6, 3, 0.5, 60 * time.Second, 0.1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := attackConfig(plan.JoinerWedge, tc.d)
			cfg.Nodes, cfg.Roles = tc.nodes, []plan.RoleShare{{Role: plan.JoinerWedge, Fraction: tc.share}}
			cfg.TimeScale = tc.scale // the job beyond soloStep when they join
			res := runLogged(t, cfg)
			w := res.Hostile.Wedge
			if w == nil || res.Hostile.Nodes[string(plan.JoinerWedge)] != tc.k || len(w.Probes) != tc.k+1 {
				t.Fatalf("wedge figures %+v", w)
			}
			for i, j := range w.Probes {
				if float64(j.Step) > res.Steps.Max+100 || j.BarrierPasses == 0 {
					t.Errorf("joiner %d through wedge nodes: step %d (honest at most %.0f), %d passes in %d checks",
						i, j.Step, res.Steps.Max, j.BarrierPasses, j.BarrierChecks)
				}
			}
			if w.Wedged != 0 {
				t.Errorf("%d of %d joiners took the wedges' step", w.Wedged, len(w.Probes))
			}
		})
	}
	// Drift poisoners until 30 s, then none: the honest loss (clean about
	// 0.005) must stay within 10× with two against three and within 100×
	// with as many as the honest nodes, and come back once they are gone.
	for _, tc := range []struct {
		name         string
		nodes, k     int
		share, times float64
	}{{"drift poison, k = 2, h = 3", 5, 2, 0.4, 10}, {"drift poison, k = h = 3", 6, 3, 0.5, 100}} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := attackConfig(plan.DriftPoison, 50*time.Second)
			cfg.Nodes, cfg.Roles = tc.nodes, []plan.RoleShare{{Role: plan.DriftPoison, Fraction: tc.share}}
			cfg.Exchange = exchange.Spec{Kind: exchange.Epidemic, S: 4}
			cfg.TimeScale = 0.1
			cfg.Script = []plan.Event{{At: 30 * time.Second, Action: plan.CrashHostile}}
			res := runLogged(t, cfg)
			if d := res.Hostile.Drift; d == nil || d.Taken == 0 {
				t.Fatalf("drift figures %+v", d)
			}
			const clean = 0.005
			worst, last := 0.0, 0.0
			for _, a := range res.Rows.Accuracy {
				if a.T <= 30 {
					worst = max(worst, a.Loss)
				}
				last = a.Loss
			}
			if worst > tc.times*clean || last > 2*clean {
				t.Errorf("honest loss up to %.4g while they pushed (want within %.0f× of %.3f), %.4g 20 s after they left", worst, tc.times, clean, last)
			}
			crashed := 0
			for _, c := range res.Rows.Churn {
				if plan.Action(c.Kind) == plan.Crash && c.T >= 30 {
					crashed++
				}
			}
			if crashed != tc.k {
				t.Errorf("%d nodes crashed at 30 s, want the %d poisoners", crashed, tc.k)
			}
		})
	}
	t.Run("estimate liars, k = 2, h = 3", func(t *testing.T) {
		cfg := tinyConfig(5, 20*time.Second)
		cfg.Roles = []plan.RoleShare{{Role: plan.EstimateLiar, Fraction: 0.4}}
		res := runLogged(t, cfg)
		if res.Hostile.Nodes[string(plan.EstimateLiar)] != 2 || res.Hostile.LiarQueries == 0 {
			t.Fatalf("hostile report %+v", res.Hostile)
		}
		if u := res.Population.Used; u == nil || u.WorstFactor > 2 {
			t.Errorf("two liars beside three honest nodes: population used %+v, want within 2× of the truth at every reading", u)
		}
	})
}
