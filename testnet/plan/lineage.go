package plan

import (
	"crypto/sha256"
	"encoding/binary"

	"github.com/libp2p/go-libp2p/core/pnet"

	"github.com/pspnode/pspnode/internal/lineage"
)

// Genesis is the lineage of every node of a testnet, whose nodes
// start the job together (without it each would start its own, and the
// nodes would then converge on one): a genesis of the Unix epoch and
// the seed, older than any a real node makes.
func Genesis(seed uint64) lineage.Genesis {
	var g lineage.Genesis
	binary.BigEndian.PutUint64(g[8:], seed|1<<63)
	return g
}

// PSK is the swarm key of a private testnet: a function of the seed.
func PSK(seed uint64) pnet.PSK {
	sum := sha256.Sum256(binary.BigEndian.AppendUint64([]byte("testnet swarm key"), seed))
	return pnet.PSK(sum[:])
}
