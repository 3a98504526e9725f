package model

import (
	"fmt"
	"testing"
)

// indexed returns a regression dataset of n rows whose single feature is the
// row index, so a shard's rows name the examples it holds.
func indexed(n int) *Dataset {
	ds := &Dataset{Name: "indexed", Dim: 1, X: make([]float64, n), Targets: make([]float64, n)}
	for i := range n {
		ds.X[i] = float64(i)
	}
	return ds
}

func TestShardOfPartition(t *testing.T) {
	for _, tc := range []struct{ rows, n int }{{10, 1}, {10, 3}, {100, 7}, {8000, 16}, {8000, 32}, {5, 5}} {
		t.Run(fmt.Sprintf("%d/%d", tc.rows, tc.n), func(t *testing.T) {
			ds := indexed(tc.rows)
			seen := make([]int, tc.rows)
			for i := range tc.n {
				s, err := ShardOf(ds, i, tc.n)
				if err != nil {
					t.Fatal(err)
				}
				if size := s.Len(); size < tc.rows/tc.n || size > tc.rows/tc.n+1 {
					t.Errorf("shard %d has %d rows, want %d or %d", i, size, tc.rows/tc.n, tc.rows/tc.n+1)
				}
				for _, x := range s.X {
					seen[int(x)]++
				}
				again, _ := ShardOf(ds, i, tc.n)
				for k := range s.X {
					if again.X[k] != s.X[k] {
						t.Fatalf("shard %d not deterministic", i)
					}
				}
			}
			for ex, c := range seen {
				if c != 1 {
					t.Fatalf("example %d is in %d shards, want exactly 1", ex, c)
				}
			}
		})
	}
}

func TestShardIsMixed(t *testing.T) {
	// A shard is a random subset, not a contiguous block: its examples span
	// the dataset.
	s, _ := ShardOf(indexed(8000), 0, 16)
	if lo, hi := s.X[0], s.X[s.Len()-1]; lo > 100 || hi < 7900 {
		t.Errorf("shard 0 of 16 spans examples %v to %v, want nearly all of 0..7999", lo, hi)
	}
}

func TestShardByKey(t *testing.T) {
	ds := indexed(1000)
	a, err := Shard(ds, "12D3KooWPeerA", 8)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := ShardOf(ds, ShardIndex("12D3KooWPeerA", 8), 8)
	if a.Len() != b.Len() || a.X[0] != b.X[0] {
		t.Error("Shard(key) differs from ShardOf(ShardIndex(key))")
	}
	// Keys spread uniformly over shards.
	const n, keys = 8, 8000
	count := make([]int, n)
	for k := range keys {
		i := ShardIndex(fmt.Sprintf("peer-%d", k), n)
		if i < 0 || i >= n {
			t.Fatalf("ShardIndex = %d, outside [0,%d)", i, n)
		}
		count[i]++
	}
	for i, c := range count {
		if c < keys/n*8/10 || c > keys/n*12/10 {
			t.Errorf("shard %d chosen by %d of %d keys, want about %d", i, c, keys, keys/n)
		}
	}
	if ShardIndex("x", 1) != 0 || ShardIndex("x", 0) != 0 {
		t.Error("ShardIndex with n <= 1 must be 0")
	}
}

func TestShardErrors(t *testing.T) {
	ds := indexed(4)
	for _, tc := range []struct{ i, n int }{{0, 0}, {-1, 2}, {2, 2}, {0, 5}} {
		if _, err := ShardOf(ds, tc.i, tc.n); err == nil {
			t.Errorf("ShardOf(%d, %d) of 4 rows: no error", tc.i, tc.n)
		}
	}
	if _, err := Shard(ds, "k", 0); err == nil {
		t.Error("Shard with 0 shards: no error")
	}
}

func TestSyntheticDeterministic(t *testing.T) {
	for _, reg := range []bool{false, true} {
		cfg := DefaultSyntheticConfig(reg)
		a, err := Synthetic(cfg)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := Synthetic(cfg)
		if a.Train.Len() != 8000 || a.Test.Len() != 2000 {
			t.Errorf("sizes %d, %d", a.Train.Len(), a.Test.Len())
		}
		for i := range a.Train.X {
			if a.Train.X[i] != b.Train.X[i] {
				t.Fatalf("regression=%v: not deterministic", reg)
			}
		}
		for _, ds := range []*Dataset{a.Train, a.Test} {
			if err := ds.Validate(); err != nil {
				t.Error(err)
			}
		}
		cfg.Seed++
		c, _ := Synthetic(cfg)
		if c.Train.X[0] == a.Train.X[0] {
			t.Errorf("regression=%v: another seed gives the same data", reg)
		}
	}
	if _, err := Synthetic(SyntheticConfig{Dim: 3, Train: 1, Test: 1, Classes: 1}); err == nil {
		t.Error("one class: no error")
	}
}

func TestOpen(t *testing.T) {
	for _, spec := range []string{"synthetic", "synthetic:regression", "synthetic:classification", "mnist"} { // mnist:DIR: TestEmbeddedMNIST
		d, err := Open(spec)
		if err != nil {
			t.Errorf("%s: %v", spec, err)
			continue
		}
		if d.Train.Len() == 0 || d.Test.Len() == 0 {
			t.Errorf("%s: empty", spec)
		}
	}
	for _, spec := range []string{"", "mnist:", "csv:x", "mnist:/nonexistent"} {
		if _, err := Open(spec); err == nil {
			t.Errorf("%q: no error", spec)
		}
	}
}

func TestSubsetCopies(t *testing.T) {
	ds := indexed(5)
	s := ds.Subset([]int{4, 1})
	s.X[0] = -1
	if ds.X[4] != 4 || s.X[1] != 1 || s.Targets[0] != 0 {
		t.Error("Subset must copy rows in the given order")
	}
}
