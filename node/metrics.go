package node

import (
	"math"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pspnode/pspnode/overlay"
)

// registerGauges registers on reg the gauges read off the overlay ov, the
// host h and the census pop
// when /metrics is scraped. Set on every step instead, listing the
// connected peers alone was 2 % of a 1000-node testnet's CPU.
func registerGauges(reg prometheus.Registerer, h host.Host, ov *overlay.Overlay, pop *census) {
	gf := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "psp", Name: name, Help: help}, f)
	}
	stderr := func() float64 {
		_, se, err := ov.Estimate()
		if err != nil {
			return math.NaN()
		}
		return se
	}
	reg.MustRegister(
		gf("population_estimate", "Estimated number of nodes in the job, itself included: the population its learning rate follows (1 for a node alone).", pop.Population),
		gf("population_estimate_stderr", "Standard error of the estimators' population estimate (NaN while they have too little data).", stderr),
		gf("routing_table_size", "Peers in the Kademlia routing table.", func() float64 { return float64(ov.DHT().RoutingTable().Size()) }),
		gf("connected_peers", "Peers with an open connection.", func() float64 { return float64(len(h.Network().Peers())) }),
	)
}
