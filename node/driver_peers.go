package node

import (
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// Member reports whether p counts as one of the job's peers for what a
// driven node serves its program's peers beyond the model (a trainer's
// state): a live member the node has heard from first-hand (it answered,
// or asked this node something of its job) and not last heard on another
// lineage of the job.
func (d *Driver) Member(p peer.ID) bool {
	return d.n.ov.Knows(p) && !d.n.kin.lin.FromOther(p, time.Now())
}
