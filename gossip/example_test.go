package gossip_test

import (
	"context"
	"fmt"
	"time"

	mocknet "github.com/libp2p/go-libp2p/p2p/net/mock"
	"github.com/pspnode/pspnode/gossip"
)

// Two nodes of the job "mnist" exchange one update over an in-memory
// network. Node B applies what node A published to its own model.
func Example() {
	ctx := context.Background()
	mn := mocknet.New()
	defer mn.Close()
	a, _ := mn.GenPeer()
	b, _ := mn.GenPeer()
	_ = mn.LinkAll()

	modelB := make([]float32, 4)
	got := make(chan struct{})

	cfg := gossip.DefaultConfig()
	cfg.Job = "mnist"
	cfg.ParamCount = 4
	ga, err := gossip.New(ctx, a, cfg)
	if err != nil {
		panic(err)
	}
	defer ga.Close()

	cfg.Handler = func(u gossip.Update) {
		if err := u.AddTo(modelB, 1); err != nil { // additive update
			panic(err)
		}
		fmt.Printf("B applied step %d (%s, %d bytes)\n", u.Step, u.Encoding, u.WireSize)
		close(got)
	}
	gb, err := gossip.New(ctx, b, cfg)
	if err != nil {
		panic(err)
	}
	defer gb.Close()

	_ = mn.ConnectAllButSelf()
	for len(ga.Peers()) == 0 { // wait until A knows B is on the topic
		time.Sleep(10 * time.Millisecond)
	}
	ga.WaitMesh(ctx) // and until the heartbeat has put B in A's mesh

	// A applied this delta to its own model; now it tells the others.
	if err := ga.Publish(ctx, 1, []float32{0.5, -0.25, 0, 2}); err != nil {
		panic(err)
	}
	select {
	case <-got:
	case <-time.After(5 * time.Second):
		fmt.Println("timeout")
	}
	fmt.Println(ga.Topic(), modelB)
	// Output:
	// B applied step 1 (dense32, 69 bytes)
	// psp/mnist/updates/1 [0.5 -0.25 0 2]
}
