// Package overlay is pspnode's structured overlay: membership through a
// Kademlia DHT (go-libp2p-kad-dht), bootstrap, the population estimate from
// the density of a node's zone of the ID space, uniform sampling of β live
// peers, and liveness.
package overlay
