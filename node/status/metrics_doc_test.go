package status_test

import (
	"context"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/pspnode/pspnode/internal/builtin"
	"github.com/pspnode/pspnode/model"
	"github.com/pspnode/pspnode/node"
	"github.com/pspnode/pspnode/node/exchange"
	"github.com/pspnode/pspnode/node/status"
	"github.com/pspnode/pspnode/psp"
)

// The metrics a node exports, held against the linter, the docs and the
// dashboard: these need a whole node, so they are tests of package node's
// face from here, where the metrics are defined.

// scrapedNode builds two nodes running ex on TCP loopback, each with a
// host of its own (so go-libp2p's metrics and the connection gate's are
// registered), and returns the second, which joined through the first and
// so has the joiner's metrics too. The Go runtime and process collectors
// are added, as `pspnode run` does.
func scrapedNode(t *testing.T, ex exchange.Spec) *node.Node {
	t.Helper()
	data, err := model.Open("synthetic:regression")
	if err != nil {
		t.Fatal(err)
	}
	var boot []string
	var nd *node.Node
	for i := range 2 {
		task, err := builtin.New(builtin.Spec{Model: "linreg", Shard: i, Shards: 2, SGD: model.DefaultSGDConfig(),
			Time: builtin.TimeModel{Scale: 0.001, Factor: 1}, Seed: uint64(i + 1), InitSeed: 1}, data)
		if err != nil {
			t.Fatal(err)
		}
		cfg := node.DefaultConfig()
		cfg.Job, cfg.Listen, cfg.Bootstrap = "nodetest", []string{"/ip4/127.0.0.1/tcp/0"}, boot
		cfg.Barrier, cfg.Exchange.Spec = psp.MustParse("pssp:1:1"), ex
		cfg.Check.QueryTimeout, cfg.EvalEvery, cfg.Seed = 500*time.Millisecond, 5, uint64(i+1)
		nd, err = node.New(context.Background(), cfg, node.WithTask(task))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nd.Close() })
		boot = []string{nd.Addrs()[0].String()}
	}
	status.RegisterProcessMetrics(nd.Registry())
	return nd
}

// gossipNode is scrapedNode under the gossip exchange.
func gossipNode(t *testing.T) *node.Node { return scrapedNode(t, exchange.Spec{}) }

// families gathers a registry's metric families by name.
func families(t *testing.T, reg prometheus.Gatherer) map[string]*dto.MetricFamily {
	t.Helper()
	mfs, err := reg.Gather()
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
	b, err := os.ReadFile("../../" + name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// The node's metrics pass the linter promtool's `check metrics` runs
// (client_golang's promlint): nothing on the psp_* families. go-libp2p's
// own findings are tolerated only if docs/cli.md names them.
func TestMetricsLint(t *testing.T) {
	nd := gossipNode(t)
	problems, err := testutil.GatherAndLint(nd.Registry())
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
	fams := families(t, gossipNode(t).Registry())
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

// promQL strips what in a PromQL expression is not a metric name: string
// literals, label matchers, range and subquery brackets, grouping clauses.
var promQL = []*regexp.Regexp{
	regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|` + "`[^`]*`"),
	regexp.MustCompile(`\{[^}]*\}`),
	regexp.MustCompile(`\[[^\]]*\]`),
	regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`),
}

var (
	identifier = regexp.MustCompile(`\$?\b[a-zA-Z_:][a-zA-Z0-9_:]*`)
	// promKeywords are PromQL words that are neither functions nor metrics.
	promKeywords = []string{"and", "or", "unless", "bool", "offset", "by", "without",
		"on", "ignoring", "group_left", "group_right", "inf", "nan", "Inf", "NaN"}
)

// exprMetrics returns the metric names a PromQL expression reads:
// identifiers that are not functions, aggregations, keywords, label names
// or Grafana variables.
func exprMetrics(expr string) []string {
	for _, re := range promQL {
		expr = re.ReplaceAllString(expr, " ")
	}
	var out []string
	for _, loc := range identifier.FindAllStringIndex(expr, -1) {
		word := expr[loc[0]:loc[1]]
		rest := strings.TrimLeft(expr[loc[1]:], " \t\n")
		if strings.HasPrefix(word, "$") || strings.HasPrefix(rest, "(") || slices.Contains(promKeywords, word) {
			continue
		}
		out = append(out, word)
	}
	return out
}

func TestExprMetrics(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want []string
	}{
		{`psp_step{instance=~"$instance"}`, []string{"psp_step"}},
		{`histogram_quantile(0.9, sum by (le) (rate(psp_barrier_wait_seconds_bucket{instance=~"a|b"}[$__rate_interval])))`,
			[]string{"psp_barrier_wait_seconds_bucket"}},
		{`sum(rate(x_total[5m])) by (reason) / on(instance) group_left y offset 5m`, []string{"x_total", "y"}},
		{`count(psp_step) > bool 2 and psp_nope`, []string{"psp_step", "psp_nope"}},
	} {
		if got := exprMetrics(tc.expr); !slices.Equal(got, tc.want) {
			t.Errorf("exprMetrics(%q) = %q, want %q", tc.expr, got, tc.want)
		}
	}
}

// dashboardExprs returns every PromQL expression in a Grafana dashboard:
// the "expr" of each target, at any depth (rows nest panels).
func dashboardExprs(t *testing.T, raw string) []string {
	t.Helper()
	var doc any
	if err := json.Unmarshal([]byte(raw), &doc); err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	var out []string
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if e, ok := v["expr"].(string); ok {
				out = append(out, e)
			}
			for _, c := range v {
				walk(c)
			}
		case []any:
			for _, c := range v {
				walk(c)
			}
		}
	}
	walk(doc)
	return out
}

// missingMetrics returns the names the expressions read that no family
// exports.
func missingMetrics(exprs []string, fams map[string]*dto.MetricFamily) []string {
	missing := make(map[string]bool)
	for _, e := range exprs {
		for _, m := range exprMetrics(e) {
			if !exported(fams, m) {
				missing[m] = true
			}
		}
	}
	return slices.Sorted(maps.Keys(missing))
}

// alternatives splits a PromQL expression at its top-level `or`s: the
// operands of which one with data is enough for the expression to have
// data. Strings, label matchers and ranges are stripped first.
func alternatives(expr string) []string {
	for _, re := range promQL {
		expr = re.ReplaceAllString(expr, " ")
	}
	var out []string
	depth, from := 0, 0
	for i := 0; i < len(expr); i++ {
		switch c := expr[i]; {
		case c == '(':
			depth++
		case c == ')':
			depth--
		case depth == 0 && strings.HasPrefix(expr[i:], "or") && (i == 0 || !isIdent(expr[i-1])) &&
			(i+2 == len(expr) || !isIdent(expr[i+2])):
			out = append(out, expr[from:i])
			from = i + 2
			i++
		}
	}
	return append(out, expr[from:])
}

func isIdent(c byte) bool {
	return c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

func TestAlternatives(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want int
	}{
		{`psp_step`, 1},
		{`sum(rate(a_total{x="or"}[1m])) or sum(rate(b_total[1m]))`, 2},
		{`sum(a or b) + c`, 1},
		{`a or b or c`, 3},
		{`psp_orphans`, 1},
	} {
		if got := alternatives(tc.expr); len(got) != tc.want {
			t.Errorf("alternatives(%q) = %q, want %d", tc.expr, got, tc.want)
		}
	}
}

// Every panel of deploy/grafana-dashboard.json has data on a node run with
// the default flags, whichever exchange it runs: the default (epidemic)
// and gossip. An expression has data on a node if one of its top-level
// `or` operands reads only metrics the node exports (the dashboard's
// Updates panel reads psp_gossip_* or psp_exchange_*, whichever the node
// has). Every metric the dashboard names is exported by one of the two,
// and the dashboard has the panels the docs promise.
func TestDashboardMetricsExist(t *testing.T) {
	def := node.DefaultConfig().Exchange
	nodes := []struct {
		name string
		fams map[string]*dto.MetricFamily
	}{
		{"a default node (" + def.String() + ")", families(t, scrapedNode(t, def.Spec).Registry())},
		{"a gossip node", families(t, gossipNode(t).Registry())},
	}
	if m := missingMetrics([]string{`rate(psp_no_such_metric_total[1m])`}, nodes[0].fams); !slices.Equal(m, []string{"psp_no_such_metric_total"}) {
		t.Fatalf("a missing metric was not caught: %q", m)
	}
	if nodes[0].fams["psp_gossip_received_updates_total"] != nil {
		t.Fatalf("the default exchange (%s) exports psp_gossip_received_updates_total: this test no longer tells the exchanges apart", def)
	}
	exprs := dashboardExprs(t, readRepoFile(t, "deploy/grafana-dashboard.json"))
	if len(exprs) == 0 {
		t.Fatal("the dashboard has no expressions")
	}
	for _, e := range exprs {
		for _, nd := range nodes {
			var why []string
			for _, alt := range alternatives(e) {
				m := missingMetrics([]string{alt}, nd.fams)
				if len(m) == 0 {
					why = nil
					break
				}
				why = append(why, m...)
			}
			if why != nil {
				t.Errorf("%s: no data on %s: it lacks %q", e, nd.name, why)
			}
		}
	}
	used := make(map[string]bool)
	for _, e := range exprs {
		for _, m := range exprMetrics(e) {
			used[m] = true
			if !exported(nodes[0].fams, m) && !exported(nodes[1].fams, m) {
				t.Errorf("the dashboard reads %s, which no node exports", m)
			}
		}
	}
	for _, m := range []string{"psp_step", "psp_waiting", "psp_isolated", "psp_barrier_wait_seconds_bucket",
		"psp_barrier_check_seconds_bucket", "psp_population_estimate", "psp_updates_applied_total",
		"psp_gossip_received_updates_total", "psp_exchange_received_total", "psp_exchange_averaged_models_total",
		"psp_traffic_bytes_total", "psp_model_loss", "psp_model_accuracy", "psp_connected_peers"} {
		if !used[m] {
			t.Errorf("no dashboard panel reads %s", m)
		}
	}
}
