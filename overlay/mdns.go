package overlay

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/discovery/mdns"
)

// Finding peers on the local network with no address at all: go-libp2p's
// mDNS discovery (p2p/discovery/mdns). A node announces its peer ID and
// addresses under the job's service name (MDNSService) to every host of its
// local network, and connects to the peers it hears there; their identify
// and the DHT's routing table do the rest, as for any connection. A node
// with no bootstrap peers waits up to Config.MDNSWait for one before it
// starts the job alone, so that workers started on a LAN one after the
// other join the first instead of each starting a job of its own.
//
// It is off unless Config.MDNS is set: the announcement tells everyone on
// the network that a node of the job runs there, and where (with a swarm
// key the service name is derived from the key, so it names no job, but
// the announcement is still there to see).

// MDNSService is the mDNS service name of a job: derived from the job's
// name, or from its swarm key when it has one (so that nodes of a private
// job find only each other and the name announced says nothing of the
// job). It fits DNS-SD's 15-byte limit on a service label.
func MDNSService(job string, psk []byte) string {
	h := sha256.New()
	if len(psk) > 0 {
		h.Write([]byte("pspnode mdns psk\x00"))
		h.Write(psk)
	} else {
		h.Write([]byte("pspnode mdns job\x00"))
		h.Write([]byte(job))
	}
	return "_psp-" + hex.EncodeToString(h.Sum(nil)[:4]) + "._udp"
}

// mdnsFound is the mDNS service's notifee: it hands peers found (other
// than this node) to the overlay without blocking the service.
type mdnsFound struct {
	self peer.ID
	ch   chan peer.AddrInfo
}

func (m mdnsFound) HandlePeerFound(ai peer.AddrInfo) {
	if ai.ID == m.self || len(ai.Addrs) == 0 {
		return
	}
	select {
	case m.ch <- ai:
	default: // the overlay is behind: the peer announces itself again
	}
}

// startMDNS starts the mDNS service (Config.MDNS).
func (o *Overlay) startMDNS() error {
	o.mdnsCh = make(chan peer.AddrInfo, 64)
	s := mdns.NewMdnsService(o.h, o.cfg.MDNS, mdnsFound{self: o.h.ID(), ch: o.mdnsCh})
	if err := s.Start(); err != nil {
		return fmt.Errorf("overlay: mDNS discovery (%s): %w", o.cfg.MDNS, err)
	}
	o.mdns = s
	o.log.Info("mDNS discovery on: announcing this node on the local network", "service", o.cfg.MDNS)
	return nil
}

// awaitMDNS waits up to MDNSWait (and ctx) for peers found by mDNS, and
// returns the first and those found with it.
func (o *Overlay) awaitMDNS(ctx context.Context) []peer.AddrInfo {
	t := time.NewTimer(o.cfg.MDNSWait)
	defer t.Stop()
	var found []peer.AddrInfo
	select {
	case ai := <-o.mdnsCh:
		found = addInfo(found, ai)
	case <-t.C:
		return nil
	case <-ctx.Done():
		return nil
	}
	for {
		select {
		case ai := <-o.mdnsCh:
			found = addInfo(found, ai)
		default:
			o.log.Info("found peers of the job by mDNS", "peers", len(found))
			return found
		}
	}
}

// mdnsLoop connects to the peers mDNS finds that the host is not
// connected to, one at a time, each within ProbeTimeout, until Close.
func (o *Overlay) mdnsLoop() {
	for {
		select {
		case <-o.ctx.Done():
			return
		case ai := <-o.mdnsCh:
			if o.h.Network().Connectedness(ai.ID) == network.Connected {
				continue
			}
			ctx, cancel := context.WithTimeout(o.ctx, o.cfg.ProbeTimeout)
			err := o.h.Connect(ctx, ai)
			cancel()
			if err != nil {
				o.log.Debug("could not connect to a peer found by mDNS", "peer", ai.ID, "err", err)
			} else {
				o.log.Debug("connected to a peer found by mDNS", "peer", ai.ID)
			}
		}
	}
}

// closeMDNS stops the mDNS service, if it runs.
func (o *Overlay) closeMDNS() {
	if o.mdns != nil {
		_ = o.mdns.Close()
	}
}
