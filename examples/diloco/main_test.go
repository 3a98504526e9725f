package main

import (
	"slices"
	"strings"
	"testing"
)

func TestParseSystem(t *testing.T) {
	for _, tc := range []struct {
		in, kind, err  string
		daemon, worker []string
	}{
		{in: "ddp", kind: "ddp"},
		{in: "allreduce@--H=200", kind: "allreduce", worker: []string{"--H=200"}},
		{in: "diloco/pssp:2:4/epidemic:3:int8", kind: "diloco",
			daemon: []string{"--barrier", "pssp:2:4", "--exchange", "epidemic:3:int8"}},
		{in: "diloco/pssp:2:4/epidemic:3:int4@--merge-wait 0.3 --H=200", kind: "diloco",
			daemon: []string{"--barrier", "pssp:2:4", "--exchange", "epidemic:3:int4"}, worker: []string{"--merge-wait", "0.3", "--H=200"}},
		{in: "diloco/pssp:2:4", err: "want diloco/BARRIER/EXCHANGE"},
		{in: "ddp/bsp/gossip", err: "takes no barrier"},
		{in: "sgd", err: "optional @FLAGS"},
	} {
		kind, daemon, worker, err := parseSystem(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: error %v, want one saying %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || kind != tc.kind || !slices.Equal(daemon, tc.daemon) || !slices.Equal(worker, tc.worker) {
			t.Errorf("%q: %q %q %q %v, want %q %q %q", tc.in, kind, daemon, worker, err, tc.kind, tc.daemon, tc.worker)
		}
	}
}
