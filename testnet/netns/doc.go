// Package netns runs a testnet as real processes: each node is a
// `pspnode run` child of this binary in a network namespace of its own,
// with its own address on a bridge (internal/netns), some optionally
// behind a NAT router (plan.Config.NAT) or with a cgroup CPU quota
// (plan.Config.CPUQuota). It needs root and runs on the real clock.
// testnet.Run hands it a plan.Config whose Transport is "netns".
//
// A run reads the nodes' /status and /metrics over HTTP, tracks their
// training as the in-process testnet's recorder does (the same stall rule
// and snapshots), and returns the same report.Result, plus a
// report.NetnsReport of what each process cost.
//
//	run.go            Run: the namespaces, the processes, their flags, start and stop
//	scrape.go         reading the nodes' /status and /metrics; tracking training
//	report.go         the Result and NetnsReport from what was read
//	child_linux.go    the children die with this process (Linux)
//	child_other.go    elsewhere: not available
package netns
