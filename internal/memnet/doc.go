// Package memnet is an in-memory network for testnets of hundreds of real
// libp2p hosts in one process: go-libp2p's mocknet, with peers linked the
// first time one dials the other (instead of mocknet's N² LinkAll), a real
// connection manager on every host (mocknet hosts have none), and the
// faults and links a testnet sets: crashed peers that can no longer be
// dialled, partitions that cut links between groups, a one-way latency per
// link (fixed, or drawn once per link from a range), and a bandwidth per
// host that every stream's writes share. Every host has a public-looking
// IPv4 address in a /16 of its own, or one it is given, which several
// hosts can share (many identities behind one address).
//
// Every delay is a timer, so on a virtual clock (a testing/synctest bubble)
// the links take virtual time and nothing else does.
package memnet
