// Package model holds pspnode's models on gonum (a model is a flat parameter
// vector plus its shape, so an update is a vector), datasets (a deterministic
// synthetic generator and an MNIST IDX reader), sharding without a
// coordinator, SGD and evaluation.
//
// # Models
//
// A Model is stateless: its parameters are one []float64 laid out as its
// Shape, a list of row-major tensors. New builds one by name:
//
//   - "linreg": ŷ = w·x + b, squared loss ½(ŷ−y)²; parameters w[1×D] b[1×1].
//   - "logreg": softmax(W x + b), cross-entropy; parameters W[K×D] b[1×K].
//     For MNIST, 7850 parameters: a dense float32 update is 31 400 bytes.
//   - "mlp", "mlp:H": softmax(W2 relu(W1 x + b1) + b2), cross-entropy;
//     parameters W1[H×D] b1[1×H] W2[K×H] b2[1×K], H = 64 by default.
//
// LossGrad returns the mean loss over a batch and its gradient (computed
// with gonum matrix products); Predict returns class probabilities or the
// predicted target. Every node of a job must start from the same parameters:
// the convex models start at zero, the MLP from m.Init with an rng seeded by
// the job.
//
// # Training and updates
//
// An SGD owns one node's parameters and shard. Step runs one step of
// mini-batch SGD with the learning rate LR0/(1 + Decay·t) of local step t,
// applies it locally and returns the update delta = new − old, which the
// node publishes. Apply adds an update received from a peer. Updates are
// additive, so every node's model is the initial parameters plus the sum of
// the updates it has applied, its own included (read-my-writes). Apply and
// SetParams reject, without touching the parameters, vectors of the wrong
// length (ErrLength) or holding NaN or ±Inf (ErrNotFinite). An SGD is
// safe for concurrent use: the node's loop calls Step while the gossip
// goroutine calls Apply; Step computes its gradient on a snapshot, outside
// the lock, so Apply never waits for a gradient.
//
// # Data
//
// A Dataset holds its examples row-major in X with Labels (classification)
// or Targets (regression). Open takes the data spec of the command line:
// "synthetic" (classification), "synthetic:regression", "mnist" (the
// embedded MNIST test set) or "mnist:DIR".
//
// Synthetic generates the embedded default tasks from a seed, bit for bit the
// same on every machine: y = w·x + b + noise for regression, a Gaussian
// mixture with one mean per class for classification.
//
// LoadMNIST reads MNIST IDX files, raw or gzip. With both the train and the
// t10k sets, they are the training and held-out sets. With only one set,
// example i is held out iff i mod 5 == 4: for the 10 000-image t10k set,
// 8000 training and 2000 held-out images. EmbeddedMNIST is that split of the
// official t10k set, which the package embeds (mnist/, with its
// attribution), so no download is needed. Pixels
// are scaled to [0, 1]. ReadIDX rejects malformed files with errors wrapping
// ErrInvalidIDX, and caps sizes (MaxIDXBytes) so a hostile header cannot make
// it allocate more than the file holds.
//
// # Sharding
//
// The training set is dealt into n shards by one fixed pseudo-random
// permutation that depends only on the dataset's length: the example at
// position k of the permutation goes to shard k mod n. Shards are disjoint,
// cover the set and differ in size by at most one, and each is a uniform
// random subset. A node that knows its index i picks ShardOf(ds, i, n); a node
// that knows only its peer ID picks Shard(ds, peerID, n), the shard
// ShardIndex(peerID, n) = first 8 bytes of SHA-256(peerID) mod n. No
// coordinator is needed; two peers may share a shard, as with any rule that
// needs no agreement.
//
// # Evaluation
//
// Evaluate returns Metrics on a dataset, usually the held-out one: the mean
// loss, the accuracy (classifiers; NaN for linreg) and R² (linreg; NaN for
// classifiers).
package model
