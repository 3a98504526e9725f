package model

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
)

// shardSeed fixes the dealing permutation; changing it changes every shard.
const shardSeed = 0x7073706e6f6465 // "pspnode"

// ShardIndex maps key (a peer ID, in any stable encoding) to a shard in
// [0, n): the first 8 bytes of SHA-256(key), big-endian, mod n. It returns
// 0 if n < 1.
func ShardIndex(key string, n int) int {
	if n < 1 {
		return 0
	}
	h := sha256.Sum256([]byte(key))
	return int(binary.BigEndian.Uint64(h[:8]) % uint64(n))
}

// ShardOf returns shard i of n of ds (a copy; ds is not modified). The
// examples are dealt by a fixed pseudo-random permutation of ds's rows (it
// depends only on ds.Len()): the example at position k of the permutation
// goes to shard k mod n. So for a fixed ds and n the n shards are disjoint,
// cover ds, differ in size by at most one and are each a uniform random
// subset, with about ds's class mix. Within a shard, rows keep ds's order.
func ShardOf(ds *Dataset, i, n int) (*Dataset, error) {
	if n < 1 || i < 0 || i >= n {
		return nil, fmt.Errorf("model: shard %d of %d: want 0 <= i < n", i, n)
	}
	if ds.Len() < n {
		return nil, fmt.Errorf("model: dataset %q has %d examples, too few for %d shards", ds.Name, ds.Len(), n)
	}
	perm := shardPerm(ds.Len())
	idx := make([]int, 0, ds.Len()/n+1)
	for k := i; k < len(perm); k += n {
		idx = append(idx, perm[k])
	}
	slices.Sort(idx) // keep the dataset's order within the shard
	s := ds.Subset(idx)
	s.Name = fmt.Sprintf("%s/shard-%d-of-%d", ds.Name, i, n)
	return s, nil
}

// Shard returns the shard of ds that the node with key (its peer ID) trains
// on, when the data is dealt into n shards: ShardOf(ds, ShardIndex(key, n),
// n).
func Shard(ds *Dataset, key string, n int) (*Dataset, error) {
	if n < 1 {
		return nil, fmt.Errorf("model: %d shards, want at least 1", n)
	}
	return ShardOf(ds, ShardIndex(key, n), n)
}

func shardPerm(n int) []int {
	rng := rand.New(rand.NewPCG(shardSeed, uint64(n)))
	return rng.Perm(n)
}
