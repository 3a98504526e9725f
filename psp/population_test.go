package psp

import (
	"math"
	"testing"
)

func TestPopulation(t *testing.T) {
	old := func(ns ...float64) []Report { // reporters known for long
		out := make([]Report, len(ns))
		for i, n := range ns {
			out[i] = Report{N: n, Age: ReporterAge}
		}
		return out
	}
	fresh := func(ns ...float64) []Report { // reporters just met
		out := make([]Report, len(ns))
		for i, n := range ns {
			out[i] = Report{N: n}
		}
		return out
	}
	for _, tc := range []struct {
		name    string
		own     float64 // 0: none
		reports []Report
		known   int
		age     float64 // the node's, seconds
		want    float64
	}{
		{"own estimate alone", 48, nil, 3, ReporterAge, 48},
		{"nothing: self and known peers", 0, nil, 3, ReporterAge, 4},
		{"no own estimate, too few reports", 0, old(50, 50), 3, ReporterAge, 4},
		{"no own estimate: the reports' lower median", 0, old(40, 50, 60, 70), 3, ReporterAge, 50},
		{"own among agreeing reports", 48, old(40, 50, 52), 3, ReporterAge, 48},
		{"a joiner's own estimate below its peers' reports", 4, fresh(50, 50, 52, 49, 51), 3, 0, 50},
		{"never below self and known peers", 3, old(2, 2, 2), 9, ReporterAge, 10},
		// k ≤ h − 1 liars beside h honest nodes (the node one of them):
		// the lower median is an honest estimate.
		{"2 liars of 1e9 beside 3 honest", 5, old(5, 5, 1e9, 1e9), 4, ReporterAge, 5},
		{"2 liars of 1e9 beside 3 honest, all just heard", 5, fresh(5, 5, 1e9, 1e9), 4, 0, 5},
		{"9 liars of 1e9 beside 10 honest", 19, append(old(19, 19, 19, 19, 19, 19, 19, 19, 19), old(1e9, 1e9, 1e9, 1e9, 1e9, 1e9, 1e9, 1e9, 1e9)...), 18, ReporterAge, 19},
		{"9 liars of 1 beside 10 honest, half the peers unknown", 1000, append(old(1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000), old(1, 1, 1, 1, 1, 1, 1, 1, 1)...), 100, ReporterAge, 1000},
		// Liars quick to report: 9 heard, and 8 of the 9 honest peers.
		{"9 fresh liars beside 10 honest, one not heard yet", 19, append(fresh(19, 19, 19, 19, 19, 19, 19, 19), fresh(1e9, 1e9, 1e9, 1e9, 1e9, 1e9, 1e9, 1e9, 1e9)...), 18, 0, 19},
		// As many liars as honest nodes: the node's own vote still
		// holds a lie above.
		{"3 liars of 1e9 beside 3 honest", 6, old(6, 6, 1e9, 1e9, 1e9), 5, ReporterAge, 6},
		// Early, liars quick to report are few beside half the known
		// peers the node's own estimate weighs for.
		{"8 liars and 4 honest of 99 known, early", 100, append(fresh(1e9, 1e9, 1e9, 1e9, 1e9, 1e9, 1e9, 1e9), fresh(98, 103, 101, 99)...), 99, 0, 100},
		// Fresh identities weigh a quarter: 6 just heard weigh less than
		// 2 known long and the node.
		{"6 fresh liars beside 2 known honest", 9, append(old(9, 9), fresh(1e9, 1e9, 1e9, 1e9, 1e9, 1e9)...), 8, ReporterAge, 9},
		{"nonsense ignored", 0, old(50, 50, 50, math.NaN(), math.Inf(1), 0, -3), 3, ReporterAge, 50},
	} {
		if got := Population(tc.own, tc.reports, tc.known, tc.age); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestWeights(t *testing.T) {
	if w := ReporterWeight(0); w != NewReporterWeight {
		t.Errorf("a reporter just heard weighs %v", w)
	}
	if w := ReporterWeight(ReporterAge / 2); w <= NewReporterWeight || w >= 1 {
		t.Errorf("a reporter half-way weighs %v", w)
	}
	if w := ReporterWeight(10 * ReporterAge); w != 1 {
		t.Errorf("a reporter of long standing weighs %v", w)
	}
	for _, tc := range []struct {
		age      float64
		m, known int
		want     float64
	}{{0, 0, 0, NewReporterWeight}, {ReporterAge, 0, 0, 1}, {ReporterAge, 0, 99, 100}, {0, 12, 99, 88 * NewReporterWeight}, {ReporterAge, 99, 99, 1}, {ReporterAge, 120, 99, 1}} {
		if got := SelfWeight(tc.age, tc.m, tc.known); got != tc.want {
			t.Errorf("SelfWeight(%v, %d, %d) = %v, want %v", tc.age, tc.m, tc.known, got, tc.want)
		}
	}
}

func TestBoundRate(t *testing.T) {
	for _, tc := range []struct{ prev, next, dt, want float64 }{
		{0, 1e9, 1, 1e9},                        // nothing yet: anything goes
		{100, 120, PopulationDoubling / 2, 120}, // within the rate
		{100, 1e9, PopulationDoubling, 200},     // doubles at most
		{100, 1, PopulationDoubling, 50},        // halves at most
		{100, 1e9, 0, 100},
	} {
		if got := BoundRate(tc.prev, tc.next, tc.dt); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("BoundRate(%v, %v, %v) = %v, want %v", tc.prev, tc.next, tc.dt, got, tc.want)
		}
	}
}
