package main

import (
	"bytes"
	"flag"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/libp2p/go-libp2p/core/network"

	"github.com/pspnode/pspnode/node"
	"github.com/pspnode/pspnode/node/netsetup"
)

// --nat-traversal, --relay-service and --reachability set node.Config.NAT:
// traversal and the relay service on by default, --nat-traversal=false
// turns everything off (the relay service too, unless asked for: then it
// is a usage error), --relay-service=false only the relay service,
// --reachability fixes the reachability. The start message says which.
func TestNATFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want netsetup.NATConfig
		log  string
	}{
		{nil, netsetup.NATConfig{Traversal: true, RelayService: true}, "relay_service=true"},
		{[]string{"--relay-service=false"}, netsetup.NATConfig{Traversal: true}, "relay_service=false"},
		{[]string{"--nat-traversal=false"}, netsetup.NATConfig{}, "NAT traversal off"},
		{[]string{"--nat-traversal=false", "--relay-service=false"}, netsetup.NATConfig{}, "NAT traversal off"},
		{[]string{"--reachability", "public"}, netsetup.NATConfig{Traversal: true, RelayService: true, Reachability: network.ReachabilityPublic}, `reachability="public (fixed)"`},
		{[]string{"--reachability", "private", "--relay-service=false"}, netsetup.NATConfig{Traversal: true, Reachability: network.ReachabilityPrivate}, `reachability="private (fixed)"`},
	} {
		fs := flag.NewFlagSet("run", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		def := netsetup.DefaultNATConfig()
		traversal := fs.Bool("nat-traversal", def.Traversal, "")
		relay := fs.Bool("relay-service", def.RelayService, "")
		reach := fs.String("reachability", "auto", "")
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		cfg := node.DefaultConfig()
		if err := natTraversal(&cfg, fs, *traversal, *relay, *reach); err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if cfg.NAT != tc.want {
			t.Errorf("%v: NAT %+v, want %+v", tc.args, cfg.NAT, tc.want)
		}
		var buf bytes.Buffer
		logNAT(slog.New(slog.NewTextHandler(&buf, nil)), cfg)
		if !strings.Contains(buf.String(), tc.log) {
			t.Errorf("%v: start message %q lacks %q", tc.args, buf.String(), tc.log)
		}
	}
}
