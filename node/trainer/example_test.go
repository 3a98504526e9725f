package trainer_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/pspnode/pspnode/node"
	"github.com/pspnode/pspnode/node/trainer"
	pb "github.com/pspnode/pspnode/node/trainer/trainerpb"
	"github.com/pspnode/pspnode/psp"
)

// A daemon whose steps a trainer drives, as `pspnode run --trainer` makes
// one, and a trainer in Go that takes three steps of a model of four
// parameters. (A trainer in another language uses the stubs generated
// from proto/pspnode/trainer/v3/trainer.proto the same way; the Python
// client is in clients/python.)
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "trainer-example")
	defer os.RemoveAll(dir)

	// The daemon: a driven node and its trainer API.
	task := trainer.NewRemoteModel()
	cfg := node.DefaultLocalConfig() // TCP on loopback, no NAT traversal
	cfg.Job = "example"
	cfg.Barrier = psp.MustParse("pssp:2:1")
	cfg.Driven = true
	nd, err := node.New(ctx, cfg, node.WithModel(task))
	if err != nil {
		log.Fatal(err)
	}
	defer nd.Close()
	tcfg := trainer.DefaultConfig()
	tcfg.Listen = "unix:" + filepath.Join(dir, "trainer.sock")
	srv, err := trainer.New(nd, task, tcfg)
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()

	// The trainer: a session, then one Step call per step.
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, "trainer.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	c := pb.NewTrainerClient(conn)
	sessionCtx, end := context.WithCancel(ctx)
	stream, err := c.Session(sessionCtx)
	if err != nil {
		log.Fatal(err)
	}
	_ = stream.Send(&pb.TrainerMessage{Msg: &pb.TrainerMessage_Hello{Hello: &pb.Hello{
		ApiVersion: pb.ApiVersion_API_VERSION_3, ModelName: "tiny", ModelId: 42, NumParams: 4,
		Dtype: pb.DType_DTYPE_FLOAT32, Client: "example"}}})
	var w *pb.Welcome
	for w == nil {
		m, err := stream.Recv()
		if err != nil {
			log.Fatal(err)
		}
		w = m.GetWelcome() // (a daemon still joining sends Waiting first)
	}
	fmt.Printf("welcome: start after step %d, barrier %s, exchange %s\n", w.Step, w.Barrier, w.Exchange)
	delta := make([]byte, 4*4) // four float32 zeros: this trainer's update
	// Every call of the session names it in its metadata.
	callCtx := metadata.AppendToOutgoingContext(ctx, trainer.SessionKey, w.Session)
	for s := w.Step + 1; s <= w.Step+3; s++ {
		r, err := c.Step(callCtx, &pb.StepRequest{Step: s, Update: &pb.Tensor{Carrier: &pb.Tensor_Data{Data: delta}}})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("step %d published; may take step %d; %d peer updates to merge\n", s, r.Barrier.Step, r.Pull.Merged)
	}
	end() // the trainer goes: the node leaves its peers' barriers
	fmt.Println("node at step", nd.Step())
	// Output:
	// welcome: start after step 0, barrier pssp:2:1, exchange epidemic:4
	// step 1 published; may take step 2; 0 peer updates to merge
	// step 2 published; may take step 3; 0 peer updates to merge
	// step 3 published; may take step 4; 0 peer updates to merge
	// node at step 3
}
