package node

import (
	"context"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/node/barrier"
)

// PeerPace is what the node's barrier learnt of one peer's pace
// (barrier.PeerPace).
type PeerPace = barrier.PeerPace

// PeerPace is what the node's barrier learnt of p's pace; false while it
// has learnt nothing (its barrier has no pace rule, or has not observed p
// at two steps).
func (n *Node) PeerPace(p peer.ID) (PeerPace, bool) { return n.bar.PeerPace(p) }

// barrierHooks is what the barrier asks of its node (barrier.Node): the
// realignment a failed check may call for (realign.go), and the node's
// events.
type barrierHooks Node

func (h *barrierHooks) RealignDue() bool                 { return (*Node)(h).realignDue() }
func (h *barrierHooks) Realign(ctx context.Context) bool { return (*Node)(h).realign(ctx) }
func (h *barrierHooks) PeerFailed(p peer.ID)             { (*Node)(h).emit(PeerFailed, p) }
