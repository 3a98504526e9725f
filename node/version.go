package node

import "runtime/debug"

// IdentifyProtocol is the protocol version a host the node builds
// advertises over identify: the version of pspnode's protocol suite (the
// step, model and pool protocols and the job's DHT and topic).
const IdentifyProtocol = "psp/1"

// modulePath is pspnode's Go module.
const modulePath = "github.com/pspnode/pspnode"

// Version is the version of the pspnode module in the running binary, from
// its Go build information: a tag or pseudo-version when pspnode was built
// as a dependency or with VCS stamping, else "devel".
func Version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "devel"
	}
	for _, m := range append([]*debug.Module{&bi.Main}, bi.Deps...) {
		if m.Path == modulePath && m.Version != "" && m.Version != "(devel)" {
			return m.Version
		}
	}
	return "devel"
}

// userAgent is the identify agent version a host the node builds
// advertises: cfg.UserAgent, or pspnode/<Version()>.
func userAgent(cfg Config) string {
	if cfg.UserAgent != "" {
		return cfg.UserAgent
	}
	return "pspnode/" + Version()
}
