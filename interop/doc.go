// Package interop checks pspnode's wire protocols against an implementation
// written from docs/protocols.md alone: a js-libp2p client (interop/js)
// joins a job of two `pspnode run` daemons and checks identify, a Kademlia
// lookup on the job's DHT, the GossipSub updates, a step query and a model
// fetch. The package has no code of its own, only this test; it needs
// Node.js and npm on PATH (it installs the client's pinned dependencies
// with `npm ci`) and skips without them, unless PSPNODE_REQUIRE_NODE is
// set (as CI sets it): then it fails.
package interop
