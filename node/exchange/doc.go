// Package exchange is how the nodes of a job combine their work, behind
// one interface (Exchange) that the node drives without asking which
// exchange it runs. What differs by kind is a fact of the kind
// (Kind.Averages): what a node pushes after a step (its delta, or its
// model) and whether its learning rate is scaled; what only gossip has,
// its topic, is reached through TopicOf. Models and updates are float32
// throughout, as they travel.
//
// Gossip (the zero Spec) is additive: after each step a node publishes
// its delta on the job's GossipSub topic and every node adds every other
// node's delta to its model (gossip.go). A node's traffic and CPU
// for updates grow with N: it receives N−1 updates per round, times
// GossipSub's amplification.
//
// Epidemic (DefaultConfig's, epidemic:4; epidemic.go, its sends in
// epidemic_send.go, its robust references in robust.go) is Epidemic Learning (M. de Vos,
// S. Farhadkhani, R. Guerraoui, A.-M. Kermarrec, R. Pires, R. Sharma,
// "Epidemic Learning: Boosting Decentralized Learning with Randomized
// Communication", NeurIPS 2023): after each local step a node sends its
// model to S peers drawn uniformly at random, afresh every round, and a
// node replaces its model by the average of its own and the models it
// received in the round. A node receives S models per round on average,
// whatever N: its traffic is constant in N. The peers come from the
// sampler the barrier draws from (Overlay.Sample), which is the paper's
// EL-Local variant (each node samples from its own view of the network).
//
// Rounds here are not synchronous: a node averages, before each step, the
// models that arrived since its last step (a straggler gets more of them
// and is pulled to its peers' models harder), then steps and sends. The
// sum of what arrived is kept, not the models, so a node holds one extra
// parameter vector however many arrive.
//
// Fragments (Spec.Fragments, epidemic:S:fragments=F): the model is cut
// into F fragments of consecutive values, and the round of step k sends,
// takes in and averages fragment k mod F alone (wire.Layout): a round's
// link carries 1/F of the model. A fragment that arrives ahead of its
// turn (from a peer a step ahead) is kept for its fragment's next
// average. It is for streaming DiLoCo, whose outer steps synchronise one
// fragment each (clients/python, pspnode.DiLoCo's fragments).
//
// Learning rate. Under gossip every node adds every update, so N nodes
// stepping at rate η move every model by N steps' worth; a node scales its
// rate by 1/N̂ (node.Config's ScaleLR; Kind.Averages says which) so that a round moves the models by one
// step of the mean gradient. Averaging does not add: if every node steps
// at η and then models are averaged, the mean model moves by η times the
// mean of the nodes' gradients, one step of the mean gradient, the same
// progress as gossip's per round, already. So under epidemic nodes train
// at the schedule's η unscaled, as Epidemic Learning and D-PSGD do;
// scaling by 1/N̂ would slow training N-fold.
//
// What an exchange takes in is bounded by its own limits (Config), apart
// from GossipSub's: every value within ±MaxAbsValue, steps at most
// MaxStepAhead ahead, and an update (gossip) or model (epidemic) within
// NormBound of this node's own recent steps. The exchange protocol's
// messages and streams are package wire's; this package decides what to
// send and what to take.
package exchange
