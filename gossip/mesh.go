package gossip

import (
	"context"
	"sync"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
)

// WaitMesh waits until this node's mesh on the update topic has had a
// peer, for at most two heartbeats, and reports whether it has. Without
// flood publishing (Config.FloodPublish false) a node's update goes to its mesh peers
// only, and the heartbeat grafts the first of them up to a heartbeat after
// the peers' subscriptions arrive: an update published before that would
// reach no one. A node calls WaitMesh once, before its first step; a lone
// node waits two heartbeats and goes on. With flood publishing, or with a
// PubSub passed in Config (whose mesh this package cannot watch), it
// returns true at once.
func (g *Gossip) WaitMesh(ctx context.Context) bool {
	if g.mesh == nil {
		return true
	}
	t := time.NewTimer(2 * g.cfg.GossipSub.HeartbeatInterval)
	defer t.Stop()
	select {
	case <-g.mesh.grafted:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}

// meshTracer closes grafted when the router first grafts a peer into this
// node's mesh on topic. The router calls its methods synchronously; they
// do not block.
type meshTracer struct {
	topic   string
	once    sync.Once
	grafted chan struct{}
}

func newMeshTracer(topic string) *meshTracer {
	return &meshTracer{topic: topic, grafted: make(chan struct{})}
}

func (m *meshTracer) Graft(_ peer.ID, topic string) {
	if topic == m.topic {
		m.once.Do(func() { close(m.grafted) })
	}
}

// The rest of pubsub.RawTracer: nothing to do.

func (*meshTracer) AddPeer(peer.ID, protocol.ID)             {}
func (*meshTracer) RemovePeer(peer.ID)                       {}
func (*meshTracer) Join(string)                              {}
func (*meshTracer) Leave(string)                             {}
func (*meshTracer) Prune(peer.ID, string)                    {}
func (*meshTracer) ValidateMessage(*pubsub.Message)          {}
func (*meshTracer) DeliverMessage(*pubsub.Message)           {}
func (*meshTracer) RejectMessage(*pubsub.Message, string)    {}
func (*meshTracer) DuplicateMessage(*pubsub.Message)         {}
func (*meshTracer) ThrottlePeer(peer.ID)                     {}
func (*meshTracer) RecvRPC(*pubsub.RPC)                      {}
func (*meshTracer) SendRPC(*pubsub.RPC, peer.ID)             {}
func (*meshTracer) DropRPC(*pubsub.RPC, peer.ID)             {}
func (*meshTracer) UndeliverableMessage(*pubsub.Message)     {}
func (*meshTracer) OnNewOutboundStream(peer.ID, protocol.ID) {}
func (*meshTracer) OnClosedOutboundStream(peer.ID)           {}

var _ pubsub.RawTracer = (*meshTracer)(nil)
