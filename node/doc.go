// Package node is the pspnode daemon: the libp2p host, the step and model
// protocols, and the training engine loop (compute a step, publish the
// update, pass the barrier, repeat).
package node
