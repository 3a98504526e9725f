// Package faults holds the hooks that make a node misbehave, or report the
// peers it draws and what testnets measure of it (Recent, Computing), so
// that testnets can measure how the honest nodes' defences hold. They are
// not part of node's or gossip's public API: only this module's packages
// can import this one, and production nodes never set them (pspnode run
// has no flag for any).
//
// # How a hook reaches into node and gossip
//
// The faults live in unexported fields of node.Config (faults, hostFaults)
// and gossip.Config (drop), and the figures in unexported state of
// node.Node; publishing raw bytes is an unexported method of
// gossip.Gossip. This package cannot import node or gossip (they import
// it), so it cannot name their types. Instead each of those types has one
// method that hands this package what it needs, and this package calls it
// through a small interface:
//
//	*node.Config    FaultSlots(Key) (*Node, *Host)   SetNode, SetHost
//	*node.Node      FaultProbe(Key) Probe            Recent, Computing
//	*gossip.Config  FaultDrop(Key) *func() bool      SetGossipDrop
//	*gossip.Gossip  FaultPublish(Key) PublishFunc    PublishRaw
//
// The methods are exported, as an interface of this package needs, but
// each takes a Key, a type whose values only this package makes: a program
// outside this module cannot import this package, so it can neither make
// a Key nor call the methods (short of reflection). Everything is typed:
// handing SetNode a gossip.Config, or a node.Config by value, is a compile
// error, not a panic at run time, and nothing needs to be installed by an
// init function first.
package faults
