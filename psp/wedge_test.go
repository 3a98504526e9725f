package psp

import "testing"

func TestWedge(t *testing.T) {
	far := func(step Step) []Observation {
		return []Observation{{Peer: "a", Step: step}, {Peer: "b", Step: step + 3}}
	}
	cases := []struct {
		name  string
		s     int
		self  Step
		obs   func(i int) []Observation
		every float64 // seconds between checks
		want  int     // the check (1-based) that first reports wedged; 0 for none in 30
	}{
		{"far ahead of every peer", 4, 1 << 40, func(int) []Observation { return far(100) }, 1, 11},
		{"checks come fast: wait for the seconds", 4, 1 << 40, func(int) []Observation { return far(100) }, 0.1, 101},
		{"one peer near", 4, 1 << 40, func(int) []Observation { return append(far(100), Observation{Peer: "c", Step: 1<<40 - 5}) }, 1, 0},
		{"a peer near every third check", 4, 1 << 40, func(i int) []Observation {
			if i%3 == 0 {
				return far(1<<40 - 1)
			}
			return far(100)
		}, 1, 0},
		{"no observation", 4, 1 << 40, func(int) []Observation { return nil }, 1, 0},
		{"within the gap", 4, 5000, func(int) []Observation { return far(5000 - 1000) }, 1, 0},
		{"beyond the gap of a large staleness", 100, 1 << 20, func(int) []Observation { return far(1<<20 - 6470) }, 1, 11},
		{"within the gap of a large staleness", 100, 1 << 20, func(int) []Observation { return far(1<<20 - 6400) }, 1, 0},
		{"a young node is never wedged", 4, 1000, func(int) []Observation { return far(0) }, 1, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := NewWedge(c.s)
			got := 0
			for i := 1; i <= 200 && got == 0; i++ {
				if w.Check(c.self, float64(i)*c.every, c.obs(i)) {
					got = i
				}
			}
			if c.want == 0 && got != 0 || c.want != 0 && got != c.want {
				t.Errorf("wedged at check %d, want %d", got, c.want)
			}
		})
	}
	w := NewWedge(-1)
	if w.Gap != 1024 {
		t.Errorf("ASP's gap %d", w.Gap)
	}
}
