// Package testnet runs many real pspnode nodes on one machine, injects
// stragglers, churn and hostile nodes, records what happens and draws the
// figures: it is `pspnode testnet`. Its subpackage sim is a
// discrete-event simulator of the same barriers, which a testnet run can
// be set beside.
//
// # What a testnet is
//
// A testnet is N nodes built by node.New, each a real libp2p host with the
// real Kademlia DHT, GossipSub and training engine, all in this process.
// Only the network between them is made up: on the mem transport (the
// default, for hundreds of nodes) they talk over internal/memnet, an
// in-memory network whose links can take a latency and a bandwidth, and
// which a churn script can partition (Loss, a share of step queries and
// gossip messages lost, goes through the nodes' internal/faults hooks);
// on the tcp transport they use loopback sockets. Run takes a plan.Config,
// builds the nodes, waits for their overlays to form (Warmup), starts
// every node training at once, plays the churn, and after Duration
// returns a report.Result.
//
// # Clocks
//
// By default a testnet runs on a virtual clock (plan.Virtual): a
// testing/synctest bubble (internal/vclock), where time moves only when
// every goroutine of the run is blocked. The time model's task times,
// (Exp(1)+1) s × straggle factor × TimeScale, and the links'
// latency and bandwidth are then the only things that take time; CPU work
// takes none, so the figures are the protocol's whatever the machine's
// load, and only the wall time a run takes depends on the machine. Run
// must then be called inside a bubble: a test wraps it in synctest.Test,
// and `pspnode testnet` makes one. On the real clock (plan.Real) the figures
// include this machine's CPU, and the run measures whether the machine set
// the pace (report.Overload, overload.go).
//
// # Stragglers, churn and roles
//
// A seed chooses every random thing, so one Config gives one run. Stragglers
// are round(Stragglers × N) nodes whose task times are StraggleFactor
// times longer. Churn replaces Churn × N nodes per minute: leaves and
// joins are two independent Poisson processes, and ChurnMode says whether
// leavers crash or leave gracefully; a churn script (plan.ParseScript)
// adds joins, leaves, crashes, a partition and its heal at given times.
// A joiner joins the running job as a real node does, fetching the model
// from its peers.
//
// Roles make shares of the initial nodes hostile or faulty (plan.Role,
// plan.ParseRoles, played by package hostile): step liars, update poisoners, flooders, slow peers,
// slow-model nodes, Sybil identities (ground into a victim's zone of the
// DHT key space, or many behind one address) and fake-peers nodes that
// name peers which do not exist. Hostile nodes train like the others; the
// step figures cover the honest nodes, and Hostility and Membership report
// what the defences did.
//
// # Netns mode
//
// With Transport "netns" the nodes are real processes instead (package
// testnet/netns):
// each node is a `pspnode run` child of this binary in a network namespace
// of its own, with its own address on a bridge (internal/netns), some
// optionally behind a NAT router (NAT) or with a cgroup CPU quota
// (CPUQuota). It needs root and runs on the real clock. The run reads the
// nodes' /status and /metrics over HTTP and reports the same Result, plus
// a report.NetnsReport of what each process cost.
//
// # What a run reports
//
// report.Result is what `pspnode testnet --json` prints: the step figures (final
// steps of live honest nodes, and of stragglers and the others apart),
// stalled nodes (no progress for StallWindow although the barrier, on the
// true steps of every node, would have let them go on), the population
// estimate's error, barrier check and wait times, accuracy, traffic, churn and join times, and the
// process's resources. PrintSummary prints it, and WriteOut writes its CSV
// files, PNG figures and summary.json; WriteComparison and PrintComparison
// set several runs (one per barrier) side by side, and CompareWithSim sets
// a run beside the simulator with the same parameters.
//
// # Rooms
//
// The package is the in-process network and Run; what is not special to
// it lives in subpackages, which import none of their parents:
//
//	plan/      what a run is before it runs: Config, the churn script, the roles by name, the estimate
//	report/    what a run measured and how it is shown: Result, Snapshot, the summary, CSV files, figures
//	hostile/   the hostile and faulty roles, played on the nodes this package builds (hostile.Net)
//	netns/     netns mode: a `pspnode run` process per node, each in its own namespace
//	sim/       the discrete-event simulator
//
// Run dispatches a Config whose Transport is "netns" to netns.Run;
// otherwise it builds the nodes here, asks a hostile.Play what each
// hostile node does, and fills a report.Result.
//
// # Where things are
//
//	doc.go           this overview
//	testnet.go       Run: build, warm up, train, record, report
//	cluster.go       the members: adding a node (its node.Config), kickoff, leaves, crashes, joins, partitions; the hostile roles' Net
//	churn.go         the churn: Poisson leaves and joins, the script's events
//	record.go        the recorder: snapshots, the stall rule, evaluation of the models
//	result.go        the Result from the members and the recorder's rows
//	compare.go       CompareWithSim: the same run in the simulator
//	overload.go      real clock: whether the machine set the pace (the lag probe)
//	resources.go     memory and goroutines at a quarter and at the end; goroutines of departed nodes
//	membership.go    what the honest nodes' overlays hold at the end
//	traffic.go       bytes the honest nodes' streams carried, by protocol class
//	memory.go        the memory the machine has left, which Run checks the estimate against
//	warnings.go      counting the warnings the nodes log
//
// Start with Run in testnet.go, then cluster.go for how a node is made and
// record.go for what is measured.
package testnet
