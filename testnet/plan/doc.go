// Package plan is what a testnet run is before it runs: its Config
// (DefaultConfig, Validate, the connection limits by N), the churn script
// (Event, ParseScript), the hostile and faulty roles by name and share
// (Role, RoleShare, ParseRoles; package hostile plays them), the netns
// transport's CPU quota, the testnet's lineage and swarm key, and the
// Estimate of what the run will cost. Both runners, the in-process
// testnet (package testnet) and the process-per-node one (package
// testnet/netns), take a Config from here.
//
//	config.go    Config, DefaultConfig, Validate; Clock, Latency, bandwidth parsing; Limits
//	script.go    churn scripts: Action, Event, ParseScript
//	roles.go     Role, the roles by name, RoleShare, ParseRoles, AssignRoles; Sybil settings
//	netns.go     the netns transport's settings: CPUQuota, its validation
//	lineage.go   the testnet's lineage (Genesis) and swarm key (PSK), by seed
//	estimate.go  what a run will cost, told before it starts
package plan
