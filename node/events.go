package node

import (
	"fmt"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/psp"
)

// EventKind says what an Event reports.
type EventKind uint8

// The events of a node (WithEvents).
const (
	// PeerJoined: a peer of the job answered a step query or sent one,
	// for the first time lately (again after it left, failed or went
	// unheard for twice Overlay.DeadHold).
	PeerJoined EventKind = iota + 1
	// PeerLeft: a peer said it leaves (its Leave, or a trainer gone from
	// a driven node).
	PeerLeft
	// PeerFailed: a step query to a peer failed; the node holds it dead
	// until it answers again.
	PeerFailed
	// Stepped: the node completed a step (Run's, or a Driver's Done).
	Stepped
	// Isolated: a barrier check heard from no peer of the job; the node
	// waits until one answers. Reconnected: one did.
	Isolated
	Reconnected
)

func (k EventKind) String() string {
	switch k {
	case PeerJoined:
		return "peer-joined"
	case PeerLeft:
		return "peer-left"
	case PeerFailed:
		return "peer-failed"
	case Stepped:
		return "stepped"
	case Isolated:
		return "isolated"
	case Reconnected:
		return "reconnected"
	}
	return fmt.Sprintf("EventKind(%d)", k)
}

// An Event is a change in the node's membership or progress, as it
// happened: what memberlist's EventDelegate would be told, on a channel.
type Event struct {
	Kind EventKind
	Peer peer.ID  // the peer, for the Peer* kinds
	Step psp.Step // the node's step when it happened
	At   time.Time
}
