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
	Poison func(step int64, delta []float32) []byte
	// OnSample, if set, is called with every barrier sample the node
	// draws (testnets count how often each peer is drawn).
	OnSample func(peers []peer.ID)
}

// Misbehaves reports whether f changes what the node does on the wire
// (OnSample only observes).
func (f Node) Misbehaves() bool {
	return f.StepLie != nil || f.ReplyDelay > 0 || f.Loss > 0 || f.Poison != nil
}

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

// Key is the argument of the methods through which this package reaches
// into node and gossip (see the package comment). Only this package makes
// one, so only this module can call them.
type Key struct{ _ struct{} }

// NodeConfig is a *node.Config: where a node's faults are kept.
type NodeConfig interface {
	FaultSlots(Key) (*Node, *Host)
}

// SetNode attaches f to cfg.
func SetNode(cfg NodeConfig, f Node) {
	n, _ := cfg.FaultSlots(Key{})
	*n = f
}

// SetHost attaches h to cfg.
func SetHost(cfg NodeConfig, h Host) {
	_, p := cfg.FaultSlots(Key{})
	*p = h
}

// Probe reads what testnets measure of a running node and its API does
// not tell.
type Probe struct {
	// Recent returns the node's recent barrier waits, barrier decision
	// latencies and step-query round trips, in seconds (up to the last
	// 4096 of each).
	Recent func() (waits, checks, rtts []float64)
	// Computing reports whether the node is inside its task's Step.
	Computing func() bool
}

// Observed is a *node.Node.
type Observed interface {
	FaultProbe(Key) Probe
}

// Recent returns nd's recent barrier waits, barrier decision latencies and
// step-query round trips, in seconds, for the testnet's percentiles.
func Recent(nd Observed) (waits, checks, rtts []float64) {
	return nd.FaultProbe(Key{}).Recent()
}

// Computing reports whether nd is inside its task's Step, for the
// testnet's stall detector.
func Computing(nd Observed) bool {
	return nd.FaultProbe(Key{}).Computing()
}

// GossipConfig is a *gossip.Config.
type GossipConfig interface {
	FaultDrop(Key) *func() bool
}

// SetGossipDrop makes cfg ask drop for every incoming message before
// validation, and drop the message when it returns true (lossy links).
func SetGossipDrop(cfg GossipConfig, drop func() bool) {
	*cfg.FaultDrop(Key{}) = drop
}

// PublishFunc publishes data on a gossip topic as it is, unchecked.
type PublishFunc func(ctx context.Context, data []byte) error

// RawPublisher is a *gossip.Gossip.
type RawPublisher interface {
	FaultPublish(Key) PublishFunc
}

// PublishRaw publishes data on g's topic as it is, unchecked: testnets
// play peers that send malformed or hostile updates with it.
func PublishRaw(g RawPublisher, ctx context.Context, data []byte) error {
	return g.FaultPublish(Key{})(ctx, data)
}
