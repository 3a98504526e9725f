// Package model holds pspnode's models on gonum (a model is a flat parameter
// vector plus its shape, so an update is a vector), datasets (a deterministic
// synthetic generator and an MNIST IDX reader), sharding without a
// coordinator, SGD and evaluation.
package model
