package node

import (
	"encoding/json"
	"regexp"
	"slices"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/pspnode/pspnode/node/status"
)

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
	return sortedKeys(missing)
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
	def := DefaultConfig().Exchange
	nodes := []struct {
		name string
		fams map[string]*dto.MetricFamily
	}{
		{"a default node (" + def.String() + ")", families(t, defaultExchangeNode(t))},
		{"a gossip node", families(t, scrapedNode(t))},
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

// defaultExchangeNode is scrapedNode under the default configuration's
// exchange (scrapedNode's runs gossip).
func defaultExchangeNode(t *testing.T) *Node {
	t.Helper()
	nd := buildTestNodesWith(t, 2, "pssp:1:1", 0.001, nil, func(s *nodeSetup) {
		s.Exchange = DefaultConfig().Exchange
	})[1]
	status.RegisterProcessMetrics(nd.reg)
	return nd
}
