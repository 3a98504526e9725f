package netns_test

import (
	"context"
	"fmt"
	"time"

	"github.com/pspnode/pspnode/internal/netns"
)

// Two hosts 70 ms apart (17.5 ms on each host's link, each way) at
// 400 Mbit/s, measured with TCP before anything runs on them. Needs root.
func ExampleNet_AddLinkedHost() {
	ctx := context.Background()
	if err := netns.CheckLinks(); err != nil {
		fmt.Println(err) // names what is missing: root, iproute2, /dev/net/tun
		return
	}
	n, err := netns.New(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer n.Close() // the namespaces, the TAPs and the switch go
	link := netns.Link{Delay: 17500 * time.Microsecond, Rate: 400e6 / 8}
	a, err := n.AddLinkedHost(ctx, 0, link)
	if err != nil {
		fmt.Println(err)
		return
	}
	b, err := n.AddLinkedHost(ctx, 1, link)
	if err != nil {
		fmt.Println(err)
		return
	}
	st, err := netns.MeasureLink(ctx, a, b, 20, 32<<20)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(st) // TCP round trip min 70.2 ms, median ...
	// Processes run in a host with a.Command("prog", args...); the parent
	// reaches a host's 127.0.0.1 with a.DialContext.
}
