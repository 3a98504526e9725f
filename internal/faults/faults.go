package faults

import (
	"context"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
)

// Node makes a node misbehave. The zero value is an honest node.
type Node struct {
	// StepLie, if set, replaces the step the node reports in step replies
	// (a step liar). It is called with the true step.
	StepLie func(step int64) int64
	// ReplyDelay delays every step reply (a slow peer). A delay beyond the
	// asker's query timeout makes the query time out.
	ReplyDelay time.Duration
	// Loss is the probability that an incoming step query or gossip
	// message is lost: the query is left unanswered until the asker's
	// deadline, the message is dropped before validation.
	Loss float64
	// Poison, if set, is called with each update the node would send and
	// returns the raw message to send instead (nil: send nothing). An
	// update poisoner.
	Poison func(step int64, delta []float64) []byte
	// OnSample, if set, is called with every barrier sample the node
	// draws (testnets count how often each peer is drawn).
	OnSample func(peers []peer.ID)
}

// Misbehaves reports whether f changes what the node does on the wire
// (OnSample only observes).
func (f Node) Misbehaves() bool {
	return f.StepLie != nil || f.ReplyDelay > 0 || f.Loss > 0 || f.Poison != nil
}

// SetNode attaches f to cfg, a *node.Config. Package node installs it.
var SetNode func(cfg any, f Node)

// PublishRaw publishes data on the topic of g, a *gossip.Gossip, as it is,
// unchecked: testnets play peers that send malformed or hostile updates
// with it. Package gossip installs it.
var PublishRaw func(g any, ctx context.Context, data []byte) error

// SetGossipDrop makes the gossip.Config cfg ask drop for every incoming
// message before validation, and drop the message when it returns true
// (lossy links). Package gossip installs it.
var SetGossipDrop func(cfg any, drop func() bool)

// Host changes how a node's host meets the network, so that tests on one
// machine can play a public relay and a node behind a NAT (with
// netsetup.NATConfig.Reachability fixing each one's reachability). The zero
// value changes nothing.
type Host struct {
	// Announce, if set, rewrites the addresses the host announces (a
	// loopback address as a name AutoNAT and auto-relay count as public).
	Announce func([]ma.Multiaddr) []ma.Multiaddr
	// RefuseDirectInbound refuses every inbound connection that does not
	// come through a relay, as a NAT drops unsolicited packets.
	RefuseDirectInbound bool
}

// SetHost attaches h to cfg, a *node.Config. Package node installs it.
var SetHost func(cfg any, h Host)

// Recent returns a node's (a *node.Node's) recent barrier waits, barrier
// decision latencies and step-query round trips, in seconds (up to the
// last 4096 of each), for the testnet's percentiles.
var Recent func(nd any) (waits, checks, rtts []float64)

// Computing reports whether a node (a *node.Node) is inside its task's
// Step, for the testnet's stall detector.
var Computing func(nd any) bool
