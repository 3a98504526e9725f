// Package jobname holds the one rule for a job's name, shared by node,
// overlay and gossip: the name goes into every protocol ID
// (/psp/<job>/step/1.0.0, ...) and the GossipSub topic (psp/<job>/updates/1),
// so it must be safe in both and the same everywhere a node checks it.
package jobname
