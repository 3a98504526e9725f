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
// A closed host is released: mocknet never forgets a host (it has no way
// to remove one; its maps, and the links its peers' connections name, keep
// every host it made for as long as the network lives), so Host.Close
// takes off the host what its services hung on it. It marks the peer
// gone (it can no longer be dialled), unlinks it, closes its connections,
// libp2p host and connection manager, and then drops every stream handler
// (the closures over a node: its model, routing table, pubsub state; the
// mux only ever holds stand-ins that look handlers up in a table of the
// host's, because go-multistream keeps stale copies of removed handlers),
// every notifiee signed up through Host.Network (the node's, the DHT's,
// pubsub's, the connection manager's), its peerstore (the keys, addresses
// and protocols of each peer it knew; from then on it finds nothing and
// keeps nothing), and its entries in memnet's own maps. What stays behind
// per closed host is mocknet's empty shell of it: the network and basic
// host structs, their event bus and identify service, its links, and map
// entries keyed by its peer ID in mocknet and in its peers' networks.
//
// Every delay is a timer, so on a virtual clock (a testing/synctest bubble)
// the links take virtual time and nothing else does.
package memnet
