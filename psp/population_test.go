package psp

import "testing"

func TestPopulation(t *testing.T) {
	for _, tc := range []struct {
		name    string
		est     float64 // the overlay's; 0: none
		rep     float64
		haveRep bool
		known   int
		want    float64
	}{
		{"overlay estimate alone", 48, 0, false, 3, 48},
		{"overlay agrees with reports", 40, 50, true, 3, 40},
		{"overlay at half the reports", 25, 50, true, 3, 25},
		{"overlay at twice the reports", 100, 50, true, 3, 100},
		{"joiner's overlay far below the reports", 4, 50, true, 3, 50},
		{"overlay far above the reports", 500, 50, true, 3, 50},
		{"no overlay estimate: reports", 0, 50, true, 3, 50},
		{"nothing: self and known peers", 0, 0, false, 3, 4},
		{"never below self and known peers", 3, 2, true, 3, 4},
		{"reports below self and known peers", 0, 2, true, 3, 4},
	} {
		if got := Population(tc.est, tc.rep, tc.haveRep, tc.known); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestReportQuorum(t *testing.T) {
	for _, tc := range []struct{ known, want int }{
		{0, MinReports}, {3, MinReports}, {5, MinReports}, {6, MinReports}, {7, 4}, {99, 50}, {1000, 500},
	} {
		if got := ReportQuorum(tc.known); got != tc.want {
			t.Errorf("ReportQuorum(%d) = %d, want %d", tc.known, got, tc.want)
		}
	}
}
