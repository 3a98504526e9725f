package node

import (
	"github.com/pspnode/pspnode/internal/faults"
)

// The testnets reach a node's faults and figures through these.
var (
	_ faults.NodeConfig = (*Config)(nil)
	_ faults.Observed   = (*Node)(nil)
)

// FaultSlots hands internal/faults the node's fault settings, which are
// not part of the public API (Config.faults and Config.hostFaults): its
// SetNode and SetHost set them through it. Only this module can call it:
// its argument's type is internal.
func (c *Config) FaultSlots(faults.Key) (*faults.Node, *faults.Host) {
	return &c.faults, &c.hostFaults
}

// FaultProbe hands internal/faults what testnets measure of the node and
// its API does not tell (faults.Recent, faults.Computing). Only this
// module can call it: its argument's type is internal.
func (n *Node) FaultProbe(faults.Key) faults.Probe {
	return faults.Probe{Recent: n.m.Recent, Computing: n.busy.Load}
}

// lost draws whether one incoming message is lost under faults.Loss.
func (n *Node) lost() bool {
	if n.cfg.faults.Loss <= 0 {
		return false
	}
	n.rngMu.Lock()
	defer n.rngMu.Unlock()
	return n.rng.Float64() < n.cfg.faults.Loss
}
