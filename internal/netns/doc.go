// Package netns builds a throw-away Linux network for a testnet of separate
// processes: one network namespace per node, each with its own IPv4
// address on a bridge (veth pairs), optionally behind a NAT router
// namespace of its own (nftables masquerade), with tc tbf rate limits and
// cgroup CPU quotas.
//
// It shells out to ip(8), tc(8) and nft(8) rather than using a netlink
// library: these are the tools a person debugging a run would type, every
// command the package runs can be logged and replayed by hand, the
// iproute2 and nftables packages are what the run needs anyway (ip netns
// exec starts the nodes), and the module gains no dependency. The cost is
// a fork per command, which is small next to starting a node.
//
// Every name a Net creates starts with a short run ID (namespaces
// "pspnode-<id>-…", links "p<id>…", cgroup "pspnode-<id>"), so two runs
// never collide, and Sweep can find what a crashed run left behind: the
// bridge's alias records the owning process, and Sweep removes a run's
// objects only when that process is gone. Close removes everything a Net
// made; nftables rules live inside router namespaces and go with them.
package netns
