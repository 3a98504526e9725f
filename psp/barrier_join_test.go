package psp

import "testing"

func TestJoinStep(t *testing.T) {
	for _, tc := range []struct {
		in   []Step
		want Step
	}{
		{nil, 0}, {[]Step{7}, 7}, {[]Step{9, 1, 5}, 5}, {[]Step{4, 1, 3, 2}, 2},
	} {
		in := append([]Step(nil), tc.in...)
		if got := JoinStep(tc.in); got != tc.want {
			t.Errorf("JoinStep(%v) = %d, want %d", tc.in, got, tc.want)
		}
		for i := range in {
			if in[i] != tc.in[i] {
				t.Fatalf("JoinStep modified its input")
			}
		}
	}
}
