package node

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/pspnode/pspnode/internal/vclock"
	"github.com/pspnode/pspnode/internal/wire"
	"github.com/pspnode/pspnode/node/status"
)

// scrapedNode builds two nodes on TCP loopback, each with a host of its
// own (so go-libp2p's metrics and the connection gate's are registered),
// and returns the second, which joined through the first and so has the
// joiner's metrics too. The Go runtime and process collectors are added, as
// `pspnode run` does.
func scrapedNode(t *testing.T) *Node {
	t.Helper()
	nd := buildTestNodes(t, 2, "pssp:1:1", 0.001, nil)[1]
	status.RegisterProcessMetrics(nd.reg)
	return nd
}

// families gathers a registry's metric families by name.
func families(t *testing.T, nd *Node) map[string]*dto.MetricFamily {
	t.Helper()
	mfs, err := nd.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]*dto.MetricFamily, len(mfs))
	for _, mf := range mfs {
		out[mf.GetName()] = mf
	}
	return out
}

// readRepoFile reads a file from the repository root.
func readRepoFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile("../" + name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// The node's metrics pass the linter promtool's `check metrics` runs
// (client_golang's promlint): nothing on the psp_* families. go-libp2p's
// own findings are tolerated only if docs/cli.md names them.
func TestMetricsLint(t *testing.T) {
	nd := scrapedNode(t)
	problems, err := testutil.GatherAndLint(nd.reg)
	if err != nil {
		t.Fatal(err)
	}
	doc := readRepoFile(t, "docs/cli.md")
	for _, p := range problems {
		switch {
		case strings.HasPrefix(p.Metric, "psp_"):
			t.Errorf("%s: %s", p.Metric, p.Text)
		case !strings.Contains(doc, "`"+p.Metric+"`"):
			t.Errorf("%s: %s (not among the findings docs/cli.md lists)", p.Metric, p.Text)
		default:
			t.Logf("documented: %s: %s", p.Metric, p.Text)
		}
	}
	if _, err := exec.LookPath("promtool"); err != nil {
		if os.Getenv("PSPNODE_REQUIRE_PROMTOOL") != "" {
			t.Fatal("PSPNODE_REQUIRE_PROMTOOL is set but promtool is not on PATH (Debian: apt-get install prometheus)")
		}
		t.Log("promtool not on PATH: ran client_golang's linter only")
		return
	}
	srv := httptest.NewServer(nd.Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("promtool", "check", "metrics")
	cmd.Stdin = strings.NewReader(string(body))
	// promtool exits non-zero on go-libp2p's findings too; judge its lines.
	out, _ := cmd.CombinedOutput()
	var libp2p int
	for line := range strings.Lines(string(out)) {
		switch {
		case strings.HasPrefix(line, "psp_"):
			t.Errorf("promtool check metrics: %s", strings.TrimSpace(line))
		case strings.HasPrefix(line, "libp2p_"):
			libp2p++
		}
	}
	// promtool read the exposition: it finds go-libp2p's documented
	// problems (above), so a silent promtool is not taken for a pass.
	if libp2p == 0 {
		t.Errorf("promtool reported none of go-libp2p's known findings; its output:\n%s", out)
	}
}

// metricName matches a psp_* metric name in prose.
var metricName = regexp.MustCompile(`\bpsp_[a-z0-9_]*[a-z0-9]`)

// Every psp_* family a node exports is listed in docs/cli.md, and every
// psp_* name the docs mention is one the node exports (a histogram's
// _bucket, _sum and _count series count as its family).
func TestMetricsDocumented(t *testing.T) {
	fams := families(t, scrapedNode(t))
	cli := readRepoFile(t, "docs/cli.md")
	listed := make(map[string]bool)
	for _, m := range metricName.FindAllString(cli, -1) {
		listed[m] = true
	}
	for name := range fams {
		if strings.HasPrefix(name, "psp_") && !listed[name] {
			t.Errorf("%s is not listed in docs/cli.md", name)
		}
	}
	for _, doc := range []string{"README.md", "docs/cli.md", "docs/reliability.md", "docs/protocols.md", "docs/results.md"} {
		for _, m := range metricName.FindAllString(readRepoFile(t, doc), -1) {
			if strings.HasPrefix(m, "psp_trainer_") {
				continue // the trainer API's (node/trainer), checked by its own test
			}
			if !exported(fams, m) {
				t.Errorf("%s names %s, which no node exports", doc, m)
			}
		}
	}
}

// exported says whether a series name belongs to one of the families: the
// family itself, or a histogram's or summary's _bucket, _sum or _count.
func exported(fams map[string]*dto.MetricFamily, name string) bool {
	if fams[name] != nil {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if mf := fams[base]; ok && mf != nil {
			t := mf.GetType()
			if t == dto.MetricType_HISTOGRAM || (t == dto.MetricType_SUMMARY && suffix != "_bucket") {
				return true
			}
		}
	}
	return false
}

// A malformed model request is counted as one, not as a malformed step
// request, and the stream is reset.
func TestModelRequestMalformedCounted(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		nodes := memNodes(t, 2, "pssp:1:1", 0.001)
		a, b := nodes[0], nodes[1]
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		s, err := a.Host().NewStream(ctx, b.ID(), wire.ModelProtocol(a.cfg.Job))
		if err != nil {
			t.Fatal(err)
		}
		if err := wire.WriteFrame(s, []byte{wire.Version + 1}); err != nil {
			t.Fatal(err)
		}
		_ = s.CloseWrite()
		if _, err := io.ReadAll(s); err == nil {
			t.Fatal("a model request with the wrong version was answered")
		}
		if got := status.CounterValue(b.m.ModelBad); got != 1 {
			t.Errorf("malformed model requests counted %v, want 1", got)
		}
		if got := status.CounterValue(b.m.Malformed); got != 0 {
			t.Errorf("a malformed model request counted as %v malformed step requests", got)
		}
	})
}

// sortedKeys returns a set's members in order.
func sortedKeys(set map[string]bool) []string {
	out := make([]string, 0, len(set))
	for k := range set {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
