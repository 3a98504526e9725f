package node

import (
	"fmt"

	"github.com/pspnode/pspnode/node/netsetup"
	"github.com/pspnode/pspnode/overlay"
)

// A private job: a pre-shared key (go-libp2p's private network, the
// swarm.key file kubo uses) that every connection's bytes are encrypted
// with before anything else is said, and an allowlist of peer IDs enforced
// by a connection gater (netsetup/gate.go).

// validateNetwork checks the bootstrap addresses, the swarm key and the
// allowlist.
func (c Config) validateNetwork() []error {
	var errs []error
	if _, err := overlay.ParseBootstrap(overlayConfig(c, nil).BootstrapAddrs); err != nil {
		errs = append(errs, fmt.Errorf("Bootstrap: %w", err))
	}
	if len(c.PSK) == 0 {
		return errs
	}
	if len(c.PSK) != 32 {
		errs = append(errs, fmt.Errorf("PSK: swarm key of %d bytes: want 32", len(c.PSK)))
	}
	for _, l := range c.Listen {
		if !netsetup.IsTCPAddr(l) {
			errs = append(errs, fmt.Errorf("Listen: address %q with a swarm key: only TCP runs in a private network (QUIC, WebTransport and WebRTC cannot carry a pre-shared key)", l))
		}
	}
	return errs
}
