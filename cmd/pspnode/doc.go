// Command pspnode is the pspnode CLI: a node for decentralised,
// data-parallel training with probabilistic barriers, its simulator, and
// the convergence bound. It is thin: flags become a Config of the package
// that does the work.
//
// Every subcommand exits 0 when done, 1 when its job failed, and 2 on bad
// usage, with a message naming the flag (docs/cli.md); every flag can also
// come from the environment as PSPNODE_<FLAG>.
//
// Where things are:
//
//	main.go         main, the subcommand tree, exit codes, pspnode version
//	run.go          pspnode run: its flags, the node.Config, building and running the node; pspnode id
//	preflight.go    what run checks before it builds the node: model, data, identity, listen addresses
//	private.go      private jobs (--swarm-key, --allow-peers) and pspnode keygen; the swarm.key and allowlist files
//	identity.go     identity keys: --identity's file, or a fresh key
//	trainer.go      run --trainer: a node driven by a trainer process
//	startsignal_*.go  run --start-on-signal
//	libp2plog.go    go-libp2p's logs, without fx's repeated start errors
//	testnet.go      pspnode testnet: its flags, the plan.Config, progress, profiles, output
//	sim.go          pspnode sim
//	bound.go        pspnode bound
//	flags.go        flag types shared by the subcommands (lists, bounded floats)
package main
