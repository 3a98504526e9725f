package testnet

import (
	"bytes"
	"strings"
	"testing"

	"github.com/pspnode/pspnode/testnet/report"
	"github.com/pspnode/pspnode/testnet/sim"
)

func TestParseGoroutineLabels(t *testing.T) {
	for _, tc := range []struct {
		name, profile string
		want          map[int]int
	}{
		{"empty", "goroutine profile: total 0\n", map[int]int{}},
		{"unlabelled", "goroutine profile: total 2\n2 @ 0x1 0x2\n#\t0x1\tmain.f+0x1\tf.go:1\n", map[int]int{}},
		{"two nodes", "goroutine profile: total 6\n3 @ 0x1\n# labels: {\"psp_node\":\"4\"}\n#\t0x1\tf\n\n" +
			"1 @ 0x2\n# labels: {\"psp_node\":\"7\"}\n\n2 @ 0x3\n# labels: {\"psp_node\":\"4\", \"x\":\"y\"}\n",
			map[int]int{4: 5, 7: 1}},
		{"other labels and junk", "1 @ 0x1\n# labels: {\"other\":\"1\"}\n1 @ 0x2\n# labels: {not json\n", map[int]int{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := parseGoroutineLabels(bytes.NewBufferString(tc.profile))
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("node %d: %d goroutines, want %d", k, got[k], v)
				}
			}
		})
	}
}

// A goroutine started under a node's label is counted as that node's, and
// so are the goroutines it starts.
func TestGoroutinesByNodeFollowsChildren(t *testing.T) {
	stop := make(chan struct{})
	started := make(chan struct{}, 2)
	asNode(9301, func() {
		go func() {
			go func() { started <- struct{}{}; <-stop }()
			started <- struct{}{}
			<-stop
		}()
	})
	<-started
	<-started
	got := goroutinesByNode()[9301]
	close(stop)
	if got != 2 {
		t.Fatalf("%d goroutines labelled as node 9301, want 2", got)
	}
}

// Nodes that leave or crash leave no goroutine behind, and the report has
// its resource readings.
func TestDepartedLeaveNoGoroutines(t *testing.T) {
	for _, mode := range []sim.ChurnMode{sim.Graceful, sim.Crash} {
		t.Run(mode.String(), func(t *testing.T) {
			cfg := tinyConfig(16, 2*report.DepartedGrace)
			cfg.Churn = 0.5
			cfg.ChurnMode = mode
			res := runLogged(t, cfg)
			rs := res.Resources
			if rs == nil {
				t.Fatal("no resources in the report")
			}
			if rs.Departed == 0 {
				t.Fatalf("no node departed %s before the end (%d left, %d crashed)", report.DepartedGrace, res.Left, res.Crashed)
			}
			t.Logf("resources %+v", rs)
			if rs.GoroutinesOfDeparted != 0 {
				t.Errorf("%d goroutines still run for %d departed nodes", rs.GoroutinesOfDeparted, rs.Departed)
			}
			if rs.GoroutinesAtQuarter == 0 || rs.HeapBytesEnd == 0 || rs.StackBytesEnd == 0 || rs.LiveEnd == 0 {
				t.Errorf("resources %+v", rs)
			}
			// The summary names each reading once.
			var sum strings.Builder
			res.PrintSummary(&sum)
			for _, label := range []string{"resources ", "  quarter → end", "  departed"} {
				if n := strings.Count(sum.String(), "\n"+label); n != 1 {
					t.Errorf("%d summary lines start with %q:\n%s", n, label, sum.String())
				}
			}
		})
	}
}
