package overlay_test

import (
	"context"
	"fmt"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/overlay"
)

// Example starts a four-node network over TCP loopback: the first node
// has no bootstrap peers, the others join through it. Each node then
// samples β peers and estimates the population.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	var hosts []host.Host
	var ovs []*overlay.Overlay
	defer func() {
		for i := range ovs {
			_ = ovs[i].Close()
			_ = hosts[i].Close()
		}
	}()
	for i := range 4 {
		h, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"))
		if err != nil {
			fmt.Println(err)
			return
		}
		cfg := overlay.DefaultConfig()
		cfg.Job = "example"
		cfg.WarmupWalkInterval = 200 * time.Millisecond
		if i > 0 {
			cfg.BootstrapPeers = []peer.AddrInfo{{ID: hosts[0].ID(), Addrs: hosts[0].Addrs()}}
		}
		o, err := overlay.New(ctx, h, cfg)
		if err != nil {
			_ = h.Close()
			fmt.Println(err)
			return
		}
		hosts, ovs = append(hosts, h), append(ovs, o)
	}

	last := ovs[3]
	for ctx.Err() == nil {
		if n, _, err := last.Estimate(); err == nil && n == 4 && last.Status().Pool == 3 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	sample, err := last.Sample(ctx, 2)
	if err != nil {
		fmt.Println(err)
		return
	}
	n, _, err := last.Estimate()
	fmt.Println("sampled:", len(sample), "estimate:", n, err)
	// Output: sampled: 2 estimate: 4 <nil>
}

// A bootstrap address given without a peer ID, as DDP's ranks are given
// MASTER_ADDR:MASTER_PORT: the overlay learns the peer ID at it by a
// handshake when it joins.
func ExampleParseRendezvous() {
	for _, s := range []string{"10.0.0.5:29500", "[::1]:29500", "node0.lan:29500", "/ip4/10.0.0.5/tcp/4001"} {
		a, err := overlay.ParseRendezvous(s)
		fmt.Println(a, err)
	}
	_, err := overlay.ParseRendezvous("10.0.0.5")
	fmt.Println(err != nil)
	// Output:
	// /ip4/10.0.0.5/tcp/29500 <nil>
	// /ip6/::1/tcp/29500 <nil>
	// /dns/node0.lan/tcp/29500 <nil>
	// /ip4/10.0.0.5/tcp/4001 <nil>
	// true
}
