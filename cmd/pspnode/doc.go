// Command pspnode is the pspnode CLI: a node for decentralised,
// data-parallel training with probabilistic barriers, its simulator, and
// the convergence bound. It is thin: flags become a Config of the package
// that does the work.
package main
