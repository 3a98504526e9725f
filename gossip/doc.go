// Package gossip carries model updates over one GossipSub topic per job
// (psp/<job>/updates/1): the wire format, validation before anything reaches
// a model, and compact encodings.
package gossip
