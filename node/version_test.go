package node

import (
	"strings"
	"testing"
	"time"
)

// A node's host tells its peers over identify that it is pspnode and which
// version: agent pspnode/<version>, protocol version psp/1. A configured
// UserAgent replaces the agent.
func TestIdentifyCarriesVersion(t *testing.T) {
	nodes := buildTestNodes(t, 2, "pssp:1:1", 0.001, nil)
	a, b := nodes[0], nodes[1]
	// b joined through a, so identify ran on their connection both ways.
	var agent, proto any
	if !waitFor(10*time.Second, func() bool {
		agent, _ = b.Host().Peerstore().Get(a.ID(), "AgentVersion")
		proto, _ = b.Host().Peerstore().Get(a.ID(), "ProtocolVersion")
		return agent != nil && proto != nil
	}) {
		t.Fatalf("identify never told b a's agent (%v) and protocol version (%v)", agent, proto)
	}
	if s, _ := agent.(string); !strings.HasPrefix(s, "pspnode/") || s == "pspnode/" {
		t.Errorf("agent version %q, want pspnode/<version>", agent)
	}
	if want := "pspnode/" + Version(); agent != want {
		t.Errorf("agent version %q, want %q", agent, want)
	}
	if proto != IdentifyProtocol {
		t.Errorf("protocol version %q, want %q", proto, IdentifyProtocol)
	}
	cfg := DefaultConfig()
	if got := userAgent(cfg); got != "pspnode/"+Version() {
		t.Errorf("default user agent %q", got)
	}
	cfg.UserAgent = "pspnode/v1.2.3"
	if got := userAgent(cfg); got != "pspnode/v1.2.3" {
		t.Errorf("configured user agent became %q", got)
	}
	if Version() == "" {
		t.Error("empty version")
	}
}
