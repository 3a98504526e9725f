// Package netsetup sets up how a node's libp2p host meets the network:
// the connection gate of a private job, NAT traversal, and the bounds on
// its connections. Package node
// builds its host with these options and reads the state back for
// /status and /metrics; nothing here knows of the node.
//
//   - GateOptions: the connection gater (a peer outside the allowlist is
//     refused), the TCP transport watched through its handshakes (a
//     refused connection is counted in psp_handshakes_refused_total and
//     logged), and the transports: the private network of a swarm key
//     (TCP only), or go-libp2p's others too. IsTCPAddr says which listen
//     addresses a private network runs on.
//   - NAT, NATConfig: AutoNAT, circuit relays and hole punching, all
//     go-libp2p's own services, turned on by NAT.HostOptions; NAT follows
//     the host's reachability, relays and hole punches for Status (the
//     NAT part of the node's /status) and metrics. OverRelay lets a small
//     stream run over a relayed connection.
//   - ResourceManager, TrimConns, TrimInbound: go-libp2p's resource
//     manager with the inbound limits raised and per-peer stream caps on
//     the node's protocols, and the trimming that holds a node's
//     connections under its high watermark and keeps the last quarter of
//     the inbound limit free (HandshakeHint words a failed join's error).
//
// Where things are:
//
//	gate.go    refused connections: failed handshakes and peers not allowed, counted and logged; the transports
//	nat.go     NAT traversal: AutoNAT, relays, hole punching, and what /status says of them
//	limits.go  the resource manager's connection and stream limits; trimming connections
package netsetup
