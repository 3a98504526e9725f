// Package e2e holds tests of whole nodes through package node's exported
// face alone, as a program that embeds nodes sees them: over TCP
// loopback, private jobs (a swarm key, an allowlist) and what they
// refuse, joins whose bootstrap peers are late or dead and what /status
// and /health say meanwhile, the refused handshakes' log; on the
// in-memory network, training under a barrier, stopping (Close, Leave, a
// crash, a driven node that leaves), the events a program is sent, the
// traffic each protocol carried, the population alone and after a leave,
// a population liar among three nodes, and the bound on connections. The
// tests of node's parts stay beside them in package node. It has no code
// of its own.
package e2e
