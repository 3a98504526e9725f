// Package hostile plays a testnet's hostile and faulty roles (plan.Role):
// step liars, update poisoners, flooders, slow peers, slow-model nodes,
// Sybil identities, fake-peers nodes, the impostors (lineage hijack,
// joiner wedge, estimate liar, drift poison) and the hogs. Hostile nodes
// are real nodes of the run that train like the others; this package
// makes them misbehave and counts what they did.
//
// # The model
//
// A Play is the hostile side of one run. The testnet that runs the nodes
// (package testnet, in-process) makes one with New and hands it a Net: the
// little the roles need of the run (whose node is which role, the live
// nodes of a role, a way to start a joiner through chosen nodes). The
// testnet then asks the Play, for each node it builds:
//
//   - Faults: the internal/faults settings that make the node lie, poison,
//     answer late or lose messages, set before node.New;
//   - SybilIdentity (Sybil roles): the ground key or shared address the
//     node is built with, against victims from ChooseVictims;
//   - Install: what replaces the node's handlers before it trains (a
//     fake DHT server, an impostor's step and model answers);
//   - Campaigns: what the node does beside training (flood, hijack,
//     wedge, lie, drift, hog), each run in a goroutine the testnet owns
//     until the run's context ends.
//
// While the run goes on the testnet reports the honest nodes' barrier
// samples (CountDraws) and the Sybil victims' estimates (RecordVictim);
// at the end Figures fills the report.Hostility with what the roles did.
// The roles never reach into the testnet beyond Net, and the testnet
// never into a role's state.
//
// # Where things are
//
//	play.go       Play, Net: what the testnet asks of the roles and they of it
//	roles.go      the fault roles: liars, poisoners, slow peers (Faults); flooders, slow-model nodes
//	sybil.go      the Sybil roles: key grinding, victims, their figures
//	fakepeers.go  the fake-peers role: a DHT server naming peers that do not exist
//	attacks.go    the impostor roles: lineage hijack, joiner wedge, estimate liar; their figures
//	drift.go      the drift-poison role: models pushed back moved one way
//	hogs.go       the hog roles: stream, connection and log floods
package hostile
