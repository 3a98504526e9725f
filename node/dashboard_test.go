package node

import (
	"encoding/json"
	"regexp"
	"slices"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
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

// Every metric deploy/grafana-dashboard.json reads exists in a real node's
// registry, and the dashboard has the panels the docs promise.
func TestDashboardMetricsExist(t *testing.T) {
	fams := families(t, scrapedNode(t))
	if m := missingMetrics([]string{`rate(psp_no_such_metric_total[1m])`}, fams); !slices.Equal(m, []string{"psp_no_such_metric_total"}) {
		t.Fatalf("a missing metric was not caught: %q", m)
	}
	exprs := dashboardExprs(t, readRepoFile(t, "deploy/grafana-dashboard.json"))
	if len(exprs) == 0 {
		t.Fatal("the dashboard has no expressions")
	}
	for _, m := range missingMetrics(exprs, fams) {
		t.Errorf("the dashboard reads %s, which a node does not export", m)
	}
	used := make(map[string]bool)
	for _, e := range exprs {
		for _, m := range exprMetrics(e) {
			used[m] = true
		}
	}
	for _, m := range []string{"psp_step", "psp_waiting", "psp_barrier_wait_seconds_bucket",
		"psp_barrier_check_seconds_bucket", "psp_population_estimate", "psp_updates_applied_total",
		"psp_gossip_received_updates_total", "psp_model_loss", "psp_model_accuracy", "psp_connected_peers"} {
		if !used[m] {
			t.Errorf("no dashboard panel reads %s", m)
		}
	}
}
