package node_test

import (
	"context"
	"fmt"
	"log"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/pnet"
	mocknet "github.com/libp2p/go-libp2p/p2p/net/mock"

	"github.com/pspnode/pspnode/node"
	"github.com/pspnode/pspnode/node/exchange"
	"github.com/pspnode/pspnode/psp"
)

// tally is a Task of one parameter: each step adds 1 to its own copy and
// publishes that +1 as its update; Apply adds the updates of its peers.
// With every update delivered, every node's tally is the total number of
// steps taken by all nodes. A real task trains a model instead.
type tally struct {
	mu    sync.Mutex
	total float64
}

func (t *tally) Step(ctx context.Context) ([]float64, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.total++
	return []float64{1}, nil // published to every peer
}

func (t *tally) Apply(update []float32, _ int64) error { // an update from a peer, float32 as it travels
	t.mu.Lock()
	defer t.mu.Unlock()
	t.total += float64(update[0])
	return nil
}

func (t *tally) Params() []float64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return []float64{t.total}
}

func (t *tally) SetParams(p []float64) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.total = p[0]
	return nil
}

func (t *tally) NumParams() int  { return 1 }
func (t *tally) ModelID() uint32 { return 1 } // peers must agree on it
func (t *tally) Done() bool      { return false }

// Three nodes in memory run five steps each under pSSP(2, 1): before each
// step a node asks two peers, drawn at random, for their steps, and goes on
// only if neither is more than one step behind.
func Example() {
	// An in-memory network (go-libp2p's mocknet); real nodes listen on
	// TCP or QUIC instead (cfg.Listen).
	mn := mocknet.New()
	defer mn.Close()
	const n = 3
	tasks := make([]*tally, n)
	nodes := make([]*node.Node, n)
	var boot []string // every node joins through the first
	for i := range n {
		h, err := mn.GenPeer()
		if err != nil {
			log.Fatal(err)
		}
		if err := mn.LinkAll(); err != nil { // the new host can reach the others
			log.Fatal(err)
		}
		tasks[i] = &tally{}
		cfg := node.DefaultConfig()
		cfg.Job = "example"
		cfg.Bootstrap = boot
		cfg.Barrier = psp.MustParse("pssp:2:1")
		cfg.MaxSteps = 5
		cfg.JoinFetch = false // all start together: nobody joins a running job
		// Gossip: every update reaches every node, so each tally counts
		// every step. (The default, epidemic:4, averages models instead.)
		cfg.Exchange.Spec = exchange.Spec{Kind: exchange.Gossip}
		// The settings are data (cfg); what the node runs with are options.
		nd, err := node.New(context.Background(), cfg, node.WithHost(h), node.WithTask(tasks[i]))
		if err != nil {
			log.Fatal(err)
		}
		defer nd.Close()
		nodes[i] = nd
		if i == 0 {
			boot = []string{nd.Addrs()[0].String()}
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Start once every node has the others on the update topic, so that
	// no update is published before they listen.
	for _, nd := range nodes {
		waitUntil(ctx, func() bool { return len(nd.Gossip().Peers()) == n-1 })
	}
	var wg sync.WaitGroup
	for _, nd := range nodes {
		wg.Go(func() {
			if err := nd.Run(ctx); err != nil { // returns after MaxSteps
				log.Print(err)
			}
		})
	}
	wg.Wait()

	// Updates travel by gossip: wait until each node has all of them.
	for _, t := range tasks {
		waitUntil(ctx, func() bool { return t.Params()[0] == n*5 })
	}
	for i, nd := range nodes {
		fmt.Printf("node %d: step %d, tally %v\n", i, nd.Step(), tasks[i].Params()[0])
	}
	// Output:
	// node 0: step 5, tally 15
	// node 1: step 5, tally 15
	// node 2: step 5, tally 15
}

// waitUntil polls cond until it holds or ctx ends.
func waitUntil(ctx context.Context, cond func() bool) {
	for !cond() && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
}

// A program with its own training loop drives a node (Config.Driven): the
// node keeps the membership, the barrier and the exchange, the program
// owns the model and the compute. It gives the node its Model (here the
// tally, whose Step the node never calls) and, for each step, passes the
// barrier, computes, and says it is done and what the step changed. This
// node is alone in its job; peers join it through its address.
func ExampleDriver() {
	mn := mocknet.New()
	defer mn.Close()
	h, err := mn.GenPeer()
	if err != nil {
		log.Fatal(err)
	}
	cfg := node.DefaultConfig()
	cfg.Job = "driven"
	cfg.Driven = true
	cfg.Barrier = psp.MustParse("pssp:2:1")
	cfg.Exchange.Spec = exchange.Spec{Kind: exchange.Gossip}
	model := &tally{}
	nd, err := node.New(context.Background(), cfg, node.WithHost(h), node.WithModel(model))
	if err != nil {
		log.Fatal(err)
	}
	defer nd.Close()
	d, err := nd.Driver()
	if err != nil {
		log.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Where to start: the program's own step (0 here), or the job's step
	// and model if the job is ahead of it.
	start, err := d.Begin(ctx, 0, nil, nil)
	if err != nil {
		log.Fatal(err)
	}
	d.Activate("example") // from now on peers wait for this node
	defer d.Deactivate("done")
	for step := start.Step + 1; step <= start.Step+3; step++ {
		if _, err := d.Barrier(ctx, step); err != nil {
			log.Fatal(err)
		}
		delta, _ := model.Step(ctx) // the program's own compute
		if err := d.Done(step); err != nil {
			log.Fatal(err)
		}
		if err := d.Push(step, []float32{float32(delta[0])}, nil); err != nil { // to the peers
			log.Fatal(err)
		}
	}
	fmt.Printf("step %d, tally %v\n", nd.Step(), model.Params()[0])
	// Output: step 3, tally 3
}

// A private job: every node holds the job's swarm key (32 bytes, as
// pspnode run --swarm-key reads it), and a node without it cannot even
// connect. The nodes here listen on TCP loopback (DefaultLocalConfig) and
// tell the program what happens on a channel (WithEvents).
func Example_privateJob() {
	key := make(pnet.PSK, 32)
	copy(key, "an example key, 32 bytes long!!!") // a real job draws it at random
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := func(boot []string, events chan<- node.Event) *node.Node {
		cfg := node.DefaultLocalConfig()
		cfg.Job, cfg.PSK, cfg.Bootstrap = "private", key, boot
		cfg.Barrier = psp.MustParse("pssp:1:1")
		cfg.MaxSteps = 3
		cfg.JoinFetch = false
		cfg.Exchange.Spec = exchange.Spec{Kind: exchange.Gossip}
		opts := []node.Option{node.WithTask(&tally{})}
		if events != nil {
			opts = append(opts, node.WithEvents(events))
		}
		nd, err := node.New(ctx, cfg, opts...)
		if err != nil {
			log.Fatal(err)
		}
		return nd
	}
	// a's events: b's join asks a for its step, so a hears from b
	// whatever the barrier later asks or counts without asking.
	events := make(chan node.Event, 256)
	a := start(nil, events)
	defer a.Close()
	b := start([]string{a.Addrs()[0].String()}, nil)
	defer b.Close()
	var wg sync.WaitGroup
	for _, nd := range []*node.Node{a, b} {
		wg.Go(func() {
			if err := nd.Run(ctx); err != nil {
				log.Print(err)
			}
		})
	}
	wg.Wait()
	for range len(events) {
		if ev := <-events; ev.Kind == node.PeerJoined && ev.Peer == b.ID() {
			fmt.Println("a met b:", ev.Kind)
			break
		}
	}
	fmt.Println("steps:", a.Step(), b.Step())
	// Output:
	// a met b: peer-joined
	// steps: 3 3
}
