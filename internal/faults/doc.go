// Package faults holds the hooks that make a node misbehave, or report the
// peers it draws and what testnets measure of it (Recent, Computing), so that testnets can measure how the honest nodes'
// defences hold. They are not part of node's or gossip's public API: only
// this module's packages can import this one, and production nodes never
// set them (pspnode run has no flag for any).
//
// The hooks reach into unexported fields of node.Config and gossip.Gossip.
// Those packages install the functions below when they are initialised
// (the way the standard library's internal packages reach into net/http),
// so package testnet, which imports node, finds them set.
package faults
