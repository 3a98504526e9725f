package node

import (
	"slices"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pspnode/pspnode/node/netsetup"
)

// NAT traversal for a host the node builds: Config.NAT's options, with the
// bootstrap peers as relays. The traversal itself (AutoNAT, relays, hole
// punching: go-libp2p's) and what /status says of it are in package
// netsetup.

// natOptions are the libp2p options of cfg.NAT and of the test hook
// faults.Host.Announce.
func natOptions(cfg Config, nat *netsetup.NAT, reg prometheus.Registerer) []libp2p.Option {
	var opts []libp2p.Option
	if f := cfg.hostFaults.Announce; f != nil {
		opts = append(opts, libp2p.AddrsFactory(f))
	}
	if !cfg.NAT.Traversal {
		return opts
	}
	// Validate has parsed the bootstrap addresses: each names its peer.
	// A node listed among its own bootstrap peers is not its own relay.
	var self peer.ID
	if cfg.Identity != nil {
		self, _ = peer.IDFromPrivateKey(cfg.Identity)
	}
	boot, err := overlayConfig(cfg, nil).Bootstrap()
	if err != nil {
		boot = nil
	}
	boot = slices.DeleteFunc(boot, func(ai peer.AddrInfo) bool { return ai.ID == self })
	return append(opts, nat.HostOptions(cfg.NAT, boot, reg)...)
}

// NAT returns the node's reachability, relays and connections by kind.
func (n *Node) NAT() netsetup.NATStatus {
	return n.nat.Status(n.cfg.NAT.Traversal && !n.givenHost)
}
