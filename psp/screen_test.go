package psp

import (
	"fmt"
	"testing"
)

func TestScreen(t *testing.T) {
	type report struct {
		peer     string
		step     Step
		now      float64
		interval float64
		want     Verdict
	}
	cfg := ScreenConfig{StuckIntervals: 10, StuckMin: 3, Quarantine: 60, Forget: 600, MaxPeers: 8}
	tests := []struct {
		name    string
		reports []report
	}{
		{"honest peer advancing", []report{
			{"a", 0, 0, 1, Accept}, {"a", 1, 1, 1, Accept}, {"a", 5, 5, 1, Accept}, {"a", 5, 9, 1, Accept},
		}},
		{"liar stuck at zero is refused after the window and counts again once it moves", []report{
			{"z", 0, 0, 0.5, Accept}, {"z", 0, 4, 0.5, Accept}, {"z", 0, 5.1, 0.5, Stuck}, {"z", 0, 50, 0.5, Stuck},
			{"z", 1, 51, 0.5, Accept},
		}},
		{"fast steps: the window is 10 of them", []report{
			{"f", 3, 0, 0.01, Accept}, {"f", 3, 0.09, 0.01, Accept}, {"f", 3, 0.11, 0.01, Stuck},
		}},
		{"interval not known yet: StuckMin", []report{
			{"u", 3, 0, 0, Accept}, {"u", 3, 2.9, 0, Accept}, {"u", 3, 3.1, 0, Stuck},
		}},
		{"slow straggler within window is accepted", []report{
			{"s", 2, 0, 2, Accept}, {"s", 2, 19, 2, Accept}, {"s", 3, 30, 2, Accept},
		}},
		{"regression quarantines, then trusted again", []report{
			{"r", 10, 0, 1, Accept}, {"r", 4, 1, 1, Regressed}, {"r", 20, 2, 1, Quarantined},
			{"r", 21, 59, 1, Quarantined}, {"r", 22, 62, 1, Accept},
		}},
		{"peer ahead is never screened", []report{
			{"h", 1 << 40, 0, 1, Accept}, {"h", 1<<40 + 1, 1, 1, Accept},
		}},
		{"forgotten after silence", []report{
			{"o", 10, 0, 1, Accept}, {"o", 3, 700, 1, Accept},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := NewScreen(cfg)
			for i, r := range tt.reports {
				if got := s.Check(r.peer, r.step, r.now, r.interval); got != r.want {
					t.Fatalf("report %d %+v: got %v, want %v", i, r, got, r.want)
				}
			}
		})
	}
}

func TestScreenCap(t *testing.T) {
	s := NewScreen(ScreenConfig{StuckIntervals: 10, StuckMin: 3, Quarantine: 60, Forget: 600, MaxPeers: 4})
	for i := range 100 {
		s.Check(fmt.Sprint(i), 1, float64(i), 1)
		if s.Len() > 4 {
			t.Fatalf("after %d peers the screen holds %d records, cap 4", i+1, s.Len())
		}
	}
	// The most recent peers are the ones kept: peer 99 has history.
	if v := s.Check("99", 0, 100, 1); v != Regressed {
		t.Fatalf("recent peer lost its record: %v", v)
	}
}
