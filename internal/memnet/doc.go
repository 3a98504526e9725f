// Package memnet is an in-memory network for testnets of hundreds to
// thousands of real libp2p hosts in one process.
//
// Every host is go-libp2p's basic host (identify, protocol negotiation,
// event bus, peerstore) with a real connection manager, over a
// network.Network of memnet's own in place of the swarm: no transports,
// no security handshake, no stream muxer. A connection is a pair of conns
// made at once; a stream is a pair of byte queues (one per direction) that
// a writer appends a copy to and a reader takes from. Nothing runs for an
// idle stream or connection: no goroutine and no timer. (go-libp2p's
// mocknet, which memnet replaced, runs a goroutine per stream direction,
// hands every write through a pipe, and keeps every host it ever made.)
//
// The network adds the faults and links a testnet sets: crashed peers that
// can no longer be dialled, partitions that cut links between groups, a
// one-way latency per link (fixed, or drawn once per link from a range;
// each write arrives that long after it was made, and so does the end of
// a stream, after the last write), and a bandwidth per host that every
// write shares (libp2p's own bytes, identify and protocol negotiation,
// included). A stream holds at most 256 KiB in flight per direction
// (yamux's initial window): a reader that falls behind holds up its
// writer. Read and write deadlines are honoured.
//
// Every host has a public-looking IPv4 address in a /16 of its own, or
// one it is given, which several hosts can share (many identities behind
// one address).
//
// A closed host is forgotten: the network drops it, its connections close
// at both ends (resetting their streams), and a closed conn or stream lets
// go of the host at its other end, so once the node's own goroutines have
// ended nothing refers to the host, its handlers, notifiees or peerstore.
//
// Every wait is a channel or a timer, so on a virtual clock (a
// testing/synctest bubble) the links take virtual time, nothing else does,
// and a blocked reader or writer is durably blocked.
package memnet
