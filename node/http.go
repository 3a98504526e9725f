package node

import (
	"net/http"
	"time"

	"github.com/pspnode/pspnode/node/status"
	"github.com/pspnode/pspnode/psp"
)

// Status returns the node's current status.
func (n *Node) Status() status.Status {
	st := status.Status{
		PeerID:            n.h.ID().String(),
		Job:               n.cfg.Job,
		Barrier:           n.cfg.Barrier.String(),
		Step:              n.step.Load(),
		ConnectedPeers:    len(n.h.Network().Peers()),
		ConnectionsOpened: n.opened.Load(),
		Waiting:           n.bar.Waiting(),
		Idle:              n.idle.Load(),
		UptimeS:           time.Since(n.started).Seconds(),
		StepIntervalS:     n.bar.StepInterval(),
		JoinStatus:        n.ov.JoinStatus(),
	}
	for _, a := range n.Addrs() {
		st.Addrs = append(st.Addrs, a.String())
	}
	if n.driver != nil {
		st.Trainer = n.driver.clientName()
	}
	if since := n.iso.isolatedSince(); !since.IsZero() {
		st.Isolated, st.IsolatedSince = true, since.UTC().Format(time.RFC3339)
	}
	// The population the node uses (its learning rate's), which is never
	// below itself and the live peers it knows: 1 for a node alone. The
	// error says why the estimators have none (the figure is then that
	// count), the stderr is theirs.
	st.PopulationEstimate = n.pop.Population()
	if _, se, err := n.ov.Estimate(); err != nil {
		st.EstimateError = err.Error()
	} else {
		st.EstimateStderr = se
	}
	os := n.ov.Status()
	st.RoutingTableSize, st.KnownPeers = os.RoutingTableSize, os.Members
	st.OverlayReady, st.SinceRefreshS = os.Ready, os.SinceRefresh.Seconds()
	st.PoolInDegree, st.PoolRefused = os.InDegree, os.MalformedPool
	if ev := n.lastEval.Load(); ev != nil {
		loss, acc := ev.Loss, ev.Accuracy
		st.Loss = &loss
		if acc == acc { // not NaN (regression models have no accuracy)
			st.Accuracy = &acc
		}
	}
	if n.modelUp.Load() {
		us := n.UpdateStats()
		st.UpdatesSent, st.UpdatesReceived, st.UpdatesRejected = us.Sent, us.Received, us.TotalRejected()
		x := n.exchangeStats()
		st.Exchange = &x
	}
	for _, v := range []psp.Verdict{psp.Stuck, psp.Regressed, psp.Quarantined} {
		st.ReportsScreened += uint64(status.CounterValue(n.m.Screened.WithLabelValues(v.String())))
	}
	st.UpdatesNormRefused = uint64(status.CounterValue(n.m.NormRefused))
	st.StreamsRefusedBy = make(map[string]uint64, len(status.RefusedProtocols))
	for _, p := range status.RefusedProtocols {
		v := uint64(status.CounterValue(n.m.Refused.WithLabelValues(p)))
		st.StreamsRefusedBy[p] = v
		st.StreamsRefused += v
	}
	st.BarrierChecks = uint64(status.CounterValue(n.m.Checks))
	st.ConnectionsTrimmed = uint64(status.CounterValue(n.m.ConnsTrimmed))
	st.StepDials = uint64(status.CounterValue(n.m.StepDials))
	st.BarrierWaitS, st.BarrierPasses = status.HistogramSum(n.m.Wait)
	st.Traffic = n.Traffic()
	st.NAT = n.NAT()
	st.Startup = n.Startup()
	st.Lineage, st.ForksJoined, st.PeersHeldOut = n.kin.lin.Own().String(), uint64(status.CounterValue(n.kin.lin.Converged)), n.ov.HeldOutCount()
	for _, r := range status.ResetReasons {
		st.Resets += uint64(status.CounterValue(n.m.Resets.WithLabelValues(r)))
	}
	st.ResetsRefused = uint64(status.CounterValue(n.m.ResetsRefused))
	if mt, ok := n.model.(interface{ ModelName() string }); ok {
		st.Model = mt.ModelName() // the built-in tasks' (package builtin)
	}
	return st
}

// Handler serves the node's /metrics (Prometheus text format: the psp_*
// metrics, the gossip counters and go-libp2p's own), /status (JSON) and
// /health (200 once the node has joined, 503 and the reason before, or
// while it is isolated). status.Serve serves it on an address.
func (n *Node) Handler() http.Handler { return status.Handler(n, n.reg) }

// Health is "" once the node has joined and while it is not isolated
// (isolation.go), else why it is not ready: what /health answers.
func (n *Node) Health() string {
	st := n.ov.JoinStatus()
	if !st.Joined {
		return "not joined: " + st.JoinError
	}
	return n.iso.reason()
}
