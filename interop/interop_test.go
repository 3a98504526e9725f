package interop

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	prommodel "github.com/prometheus/common/model"

	"github.com/pspnode/pspnode/internal/daemontest"
	"github.com/pspnode/pspnode/model"
)

// daemon is one `pspnode run` process.
type daemon = daemontest.Daemon

// startDaemon starts `pspnode run` (with --http) and reads its addresses.
func startDaemon(t *testing.T, bin string, args ...string) *daemon {
	t.Helper()
	return daemontest.Start(t, bin, args...)
}

type status struct {
	Step    int64 `json:"step"`
	Routing int   `json:"routing_table_size"`
	Sent    int64 `json:"updates_sent"`
}

// statusOf reads a daemon's /status.
func statusOf(d *daemon) (status, error) {
	var s status
	return s, d.GetJSON("/status", &s)
}

// waitReady waits until every daemon holds a peer in its routing table and
// has published a few updates.
func waitReady(t *testing.T, ds ...*daemon) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ready := true
		var last []status
		for _, d := range ds {
			s, err := statusOf(d)
			if err != nil {
				t.Fatalf("status of %s: %v\nstderr:\n%s", d.ID, err, d.Stderr)
			}
			last = append(last, s)
			ready = ready && s.Routing >= 1 && s.Sent >= 3
		}
		if ready {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("daemons not ready in 30 s (want a routing-table peer and 3 updates sent each): %+v", last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// npmCI installs the client's dependencies from package-lock.json unless
// node_modules already holds that lock's install.
func npmCI(t *testing.T, npm, dir string) {
	t.Helper()
	lock, err := os.Stat(filepath.Join(dir, "package-lock.json"))
	if err != nil {
		t.Fatal(err)
	}
	if inst, err := os.Stat(filepath.Join(dir, "node_modules", ".package-lock.json")); err == nil && !inst.ModTime().Before(lock.ModTime()) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, npm, "ci", "--no-audit", "--no-fund")
	cmd.Dir = dir
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm ci in %s: %v\n%s", dir, err, out)
	}
	t.Logf("npm ci: %v", time.Since(start).Round(time.Millisecond))
}

// nodeAtLeast reports whether a `node --version` string such as "v20.20.2"
// is at least major.minor.
func nodeAtLeast(v string, major, minor int) bool {
	var ma, mi int
	if _, err := fmt.Sscanf(v, "v%d.%d", &ma, &mi); err != nil {
		return false
	}
	return ma > major || ma == major && mi >= minor
}

// skipWithoutNode skips the test for want of Node.js or npm, or fails it
// when PSPNODE_REQUIRE_NODE is set (CI sets it: there the test must run).
func skipWithoutNode(t *testing.T, why string) {
	t.Helper()
	if os.Getenv("PSPNODE_REQUIRE_NODE") != "" {
		t.Fatal("PSPNODE_REQUIRE_NODE is set but " + why)
	}
	t.Skip(why)
}

// TestJSClient runs the js-libp2p client against two daemons. The client
// builds every message from docs/protocols.md; any check it fails means the
// protocol and the document have drifted apart.
func TestJSClient(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes and Node.js")
	}
	nodeBin, err := exec.LookPath("node")
	if err != nil {
		skipWithoutNode(t, "node is not on PATH: the js-libp2p interop client cannot run")
	}
	if v, err := exec.Command(nodeBin, "--version").Output(); err != nil || !nodeAtLeast(strings.TrimSpace(string(v)), 20, 19) {
		skipWithoutNode(t, fmt.Sprintf("node %q (%v): the interop client's dependencies need Node.js 20.19 or later", strings.TrimSpace(string(v)), err))
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		skipWithoutNode(t, "npm is not on PATH: the js-libp2p interop client's dependencies cannot be installed")
	}
	jsDir, err := filepath.Abs("js")
	if err != nil {
		t.Fatal(err)
	}
	npmCI(t, npm, jsDir)

	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	bin := filepath.Join(t.TempDir(), "pspnode")
	start := time.Now()
	// No symbol table or DWARF: with the packages cached, linking is most
	// of the build's time, and these daemons are never debugged.
	if out, err := exec.Command(gobin, "build", "-ldflags=-s -w", "-o", bin, "../cmd/pspnode").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	t.Logf("go build: %v", time.Since(start).Round(time.Millisecond))

	// The client computes the model id from the model's "<name>|<shape>"
	// string as section 7.5 says; the shape comes from the code.
	cfg := model.DefaultSyntheticConfig(true)
	m, err := model.New("linreg", cfg.Dim, 0)
	if err != nil {
		t.Fatal(err)
	}
	spec := m.Name() + "|" + m.Shape().String()

	const job = "interop-js"
	common := []string{
		"--listen", "/ip4/127.0.0.1/tcp/0", "--http", "127.0.0.1:0", "--job", job,
		"--model", "linreg", "--barrier", "pssp:2:4", "--time-scale", "0.02", "--log-level", "warn",
		"--exchange", "gossip", // the client speaks the gossip topic's wire
	}
	a := startDaemon(t, bin, common...)
	b := startDaemon(t, bin, append(common, "--bootstrap", a.Addr)...)
	start = time.Now()
	waitReady(t, a, b)
	t.Logf("daemons ready: %v", time.Since(start).Round(time.Millisecond))

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, nodeBin, "client.mjs")
	cmd.Dir = jsDir
	cmd.Env = append(os.Environ(),
		"PSP_JOB="+job,
		"PSP_BOOTSTRAP="+a.Addr,
		"PSP_STATUS="+a.HTTP,
		"PSP_TARGET="+b.Addr,
		"PSP_TARGET_STATUS="+b.HTTP,
		"PSP_MODEL="+spec,
		"PSP_TIMEOUT_MS=50000",
	)
	start = time.Now()
	out, err := cmd.CombinedOutput()
	t.Logf("node client.mjs (%v):\n%s", time.Since(start).Round(time.Millisecond), out)
	if err != nil {
		t.Fatalf("the js-libp2p client failed (%v); see its output above; pspnode stderr:\nA:\n%s\nB:\n%s", err, a.Stderr, b.Stderr)
	}
	// Exit 0 alone is not enough: every check must have reported.
	for _, check := range []string{"examples", "connect", "identify", "kad", "step", "step11", "model", "pool", "gossip", "invalid", "served"} {
		if !strings.Contains(string(out), fmt.Sprintf("ok   %s:", check)) {
			t.Errorf("the client reported no passing %q check", check)
		}
	}
	// What the "invalid" check claims, from the daemons' side: each
	// rejected exactly one update for its model id (the client's invalid
	// one: the daemons share a model), took in the client's three valid
	// ones, which their norm bound then refused, and ignored exactly one
	// update from too far ahead (the client's last).
	for _, d := range []*daemon{a, b} {
		mismatch, err := metricValue(d, "psp_gossip_rejected_updates_total", map[string]string{"reason": "model_mismatch"})
		if err != nil || mismatch != 1 {
			t.Errorf("daemon %s: model_mismatch rejections %v (%v), want 1", d.ID, mismatch, err)
		}
		ahead, err := metricValue(d, "psp_gossip_rejected_updates_total", map[string]string{"reason": "step_too_far_ahead"})
		if err != nil || ahead != 1 {
			t.Errorf("daemon %s: updates ignored as too far ahead %v (%v), want 1", d.ID, ahead, err)
		}
		refused, err := metricValue(d, "psp_updates_norm_refused_total", nil)
		if err != nil || refused < 3 {
			t.Errorf("daemon %s: updates refused by the norm bound %v (%v), want at least the client's 3", d.ID, refused, err)
		}
	}
}

// metricValue reads the sample of counter, gauge or untyped metric name
// whose labels are exactly labels (nil: none) from a daemon's /metrics.
func metricValue(d *daemon, name string, labels map[string]string) (float64, error) {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(d.HTTP + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(prommodel.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return 0, err
	}
	for _, m := range fams[name].GetMetric() {
		got := map[string]string{}
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		if !maps.Equal(got, labels) {
			continue
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue(), nil
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), nil
		case m.Untyped != nil:
			return m.GetUntyped().GetValue(), nil
		}
	}
	return 0, fmt.Errorf("no sample %s%v", name, labels)
}
