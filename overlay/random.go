package overlay

import (
	crand "crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math/rand/v2"

	kb "github.com/libp2p/go-libp2p-kbucket"
	"github.com/libp2p/go-libp2p/core/peer"
)

// The overlay's random choices come from four streams, one per kind of
// choice, so that each depends only on the seed and on the choices of its
// own kind made before it: the walk keys, for instance, are the same for
// the same seed however often the pool rotated in between.
const (
	streamPool   = "pool"   // reservoir, rotation, refill, Sample, revival probes
	streamWalk   = "walk"   // random-walk lookup keys
	streamBucket = "bucket" // keys of the refresh's lookups in stale buckets
	streamJitter = "jitter" // jitter of the walk and refresh periods
	streamJoin   = "join"   // the joiner's retry jitter and split-check draws
)

// newStream returns the random stream for one kind of choice: derived from
// seed and the kind's name when seed is non-zero, seeded from crypto/rand
// when it is 0.
func newStream(seed uint64, kind string) *rand.Rand {
	var s [32]byte
	if seed == 0 {
		_, _ = crand.Read(s[:]) // never fails (crypto/rand crashes the program instead)
	} else {
		s = sha256.Sum256(binary.BigEndian.AppendUint64([]byte("psp-overlay/"+kind+"/"), seed))
	}
	return rand.New(rand.NewChaCha8(s))
}

// randomKey draws a 32-byte DHT key, as a string (what lookup takes).
func randomKey(r *rand.Rand) string {
	var b [32]byte
	for i := 0; i < len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	return string(b[:])
}

// bucketKey draws a key for refreshing the routing-table bucket of
// common-prefix length cpl: one whose DHT key (its SHA-256) shares exactly
// cpl leading bits with self. Such keys must be found by hashing, so, like
// the library's refresh, it takes them from kbucket's table of peer IDs
// with known 16-bit hash prefixes (cpl is at most kb.PeerIDPreimageMaxCpl,
// 15). It chooses the prefix itself: self's first cpl bits, the next bit
// flipped, the rest from r. It then asks the table for that exact prefix:
// kb.GenRandPeerIDWithCPL with a CPL of 15 against a target that differs
// from the prefix in its 16th bit leaves no bit for the library to choose.
func bucketKey(self kb.ID, cpl uint, r *rand.Rand) (peer.ID, error) {
	if cpl > kb.PeerIDPreimageMaxCpl || len(self) < 2 {
		return "", fmt.Errorf("overlay: no refresh key for common-prefix length %d", cpl)
	}
	const last = kb.PeerIDPreimageMaxCpl // 15: the last bit of the 16-bit prefix
	selfPrefix := binary.BigEndian.Uint16(self)
	keep := ^uint16(0) << (16 - cpl) // self's first cpl bits (none for cpl 0)
	flip := uint16(0x8000) >> cpl    // the bit after them
	rest := flip - 1                 // random bits after that
	prefix := selfPrefix&keep | (selfPrefix^flip)&flip | uint16(r.Uint32())&rest
	target := make(kb.ID, 2)
	binary.BigEndian.PutUint16(target, prefix^(0x8000>>last))
	return kb.GenRandPeerIDWithCPL(target, last)
}
