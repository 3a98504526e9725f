package model_test

import (
	"fmt"
	"log"
	"math/rand/v2"

	"github.com/pspnode/pspnode/model"
)

// A node trains logistic regression on its shard of the synthetic task,
// publishes each step's update and adds the updates it receives.
func Example() {
	data, err := model.Open("synthetic")
	if err != nil {
		log.Fatal(err)
	}
	m, err := model.New("logreg", data.Train.Dim, data.Train.Classes)
	if err != nil {
		log.Fatal(err)
	}
	shard, err := model.Shard(data.Train, "12D3KooWExamplePeer", 4)
	if err != nil {
		log.Fatal(err)
	}
	tr, err := model.NewSGD(m, shard, m.Init(nil), model.DefaultSGDConfig())
	if err != nil {
		log.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 300 {
		delta, _, err := tr.Step(rng) // already applied locally
		if err != nil {
			log.Fatal(err)
		}
		_ = delta // publish it; peers call Apply(delta)
	}
	met, err := tr.Evaluate(data.Test)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%d params, shard of %d examples, held-out accuracy above 0.85: %v\n",
		m.NumParams(), shard.Len(), met.Accuracy > 0.85)
	// Output: 84 params, shard of 2000 examples, held-out accuracy above 0.85: true
}

// Apply rejects a bad update and leaves the parameters as they were.
func ExampleSGD_Apply() {
	data, _ := model.Open("synthetic:regression")
	m, _ := model.New("linreg", data.Train.Dim, 0)
	tr, _ := model.NewSGD(m, data.Train, m.Init(nil), model.DefaultSGDConfig())

	fmt.Println(tr.Apply(make([]float64, 3)))
	bad := make([]float64, m.NumParams())
	bad[5] = 1.0 / zero()
	fmt.Println(tr.Apply(bad))
	fmt.Println(tr.Apply(make([]float64, m.NumParams())), tr.Applied())
	// Output:
	// model: apply: update has length 3, want 21: wrong vector length
	// model: apply: update element 5 is +Inf: value not finite
	// <nil> 1
}

func zero() float64 { return 0 }

// The MNIST test set ships inside the package: Open("mnist") or
// EmbeddedMNIST splits its 10 000 images 8000 / 2000.
func ExampleEmbeddedMNIST() {
	data, err := model.EmbeddedMNIST()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(data.Train.Name, data.Train.Len(), data.Train.Dim)
	fmt.Println(data.Test.Name, data.Test.Len())
	// Output:
	// mnist-t10k/train 8000 784
	// mnist-t10k/heldout 2000
}

// For the full 60 000-image training set, download the four MNIST files
// (train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz and the t10k
// pair) into a directory: the train files are then the training set and
// t10k the held-out set. The data spec "mnist:DIR" does the same.
func ExampleLoadMNIST() {
	// A directory of MNIST's IDX files as distributed, gzipped or not:
	// here the package's own, which holds the t10k pair alone, so 1 in 5
	// images is held out. With the train pair beside it (a full
	// download), it prints 60000 10000.
	data, err := model.LoadMNIST("mnist")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(data.Train.Len(), data.Test.Len())
	// Output: 8000 2000
}

// ShardOf deals a dataset into disjoint, balanced shards; Shard picks one by
// peer ID.
func ExampleShardOf() {
	data, _ := model.Open("synthetic")
	total := 0
	for i := range 3 {
		s, _ := model.ShardOf(data.Train, i, 3)
		total += s.Len()
		fmt.Print(s.Len(), " ")
	}
	fmt.Println(total, model.ShardIndex("12D3KooWExamplePeer", 3) < 3)
	// Output: 2667 2667 2666 8000 true
}

func ExampleNew() {
	for _, name := range []string{"linreg", "logreg", "mlp", "mlp:32"} {
		classes := 10
		if name == "linreg" {
			classes = 0
		}
		m, err := model.New(name, 784, classes)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%-7s %6d params: %v\n", m.Name(), m.NumParams(), m.Shape())
	}
	// Output:
	// linreg     785 params: w[1x784] b[1x1]
	// logreg    7850 params: W[10x784] b[1x10]
	// mlp      50890 params: W1[64x784] b1[1x64] W2[10x64] b2[1x10]
	// mlp:32   25450 params: W1[32x784] b1[1x32] W2[10x32] b2[1x10]
}
