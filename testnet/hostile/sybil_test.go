package hostile

import (
	"testing"

	kb "github.com/libp2p/go-libp2p-kbucket"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/internal/memnet"
)

// grindKey finds keys whose DHT key shares the asked prefix with the
// target, within its bound, and the same keys for the same stream.
func TestGrindKey(t *testing.T) {
	target := kb.ConvertKey("victim")
	total := 0
	for i := range 8 {
		id, err := grindKey(memnet.KeySource(uint64(i+1), "grind"), target, 6)
		if err != nil {
			t.Fatal(err)
		}
		p, err := peer.IDFromPrivateKey(id.Key)
		if err != nil {
			t.Fatal(err)
		}
		if c := kb.CommonPrefixLen(kb.ConvertPeerID(p), target); c < 6 {
			t.Errorf("ground key shares %d bits, want >= 6", c)
		}
		if id.Keygens < 1 || id.Keygens > 64<<6 {
			t.Errorf("%d keys generated, want 1 to %d", id.Keygens, 64<<6)
		}
		total += id.Keygens
		again, _ := grindKey(memnet.KeySource(uint64(i+1), "grind"), target, 6)
		if !again.Key.Equals(id.Key) {
			t.Error("the same stream ground a different key")
		}
	}
	// 2^6 tries on average: 8 grinds take 512, and far more than 4× that
	// would mean the prefix is not what is searched for.
	t.Logf("%d keys generated for 8 prefixes of 6 bits", total)
	if total > 4*8<<6 {
		t.Errorf("%d keys generated for 8 prefixes of 6 bits, want about %d", total, 8<<6)
	}
}
