package netns

import (
	"math"
	"reflect"
	"strings"
	"testing"
)

// A node's /metrics as promhttp writes it, cut down: a histogram, a
// counter, a gauge, a labelled counter and an untyped sample.
const nodeMetrics = `# HELP psp_sample_rtt_seconds Round trip of one step query.
# TYPE psp_sample_rtt_seconds histogram
psp_sample_rtt_seconds_bucket{le="0.0001"} 0
psp_sample_rtt_seconds_bucket{le="0.0002"} 4
psp_sample_rtt_seconds_bucket{le="0.0004"} 10
psp_sample_rtt_seconds_bucket{le="+Inf"} 12
psp_sample_rtt_seconds_sum 0.0061
psp_sample_rtt_seconds_count 12
# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 3.25
# HELP process_resident_memory_bytes Resident memory size in bytes.
# TYPE process_resident_memory_bytes gauge
process_resident_memory_bytes 5.2428800e+07
# HELP psp_streams_refused_total Streams refused, by protocol.
# TYPE psp_streams_refused_total counter
psp_streams_refused_total{protocol="step"} 7
psp_step 41
`

func TestParseMetrics(t *testing.T) {
	for _, tc := range []struct {
		name   string
		body   string
		values map[string]float64
		hists  map[string]histogram
		err    string // a part of the error; "" for none
	}{
		{
			name: "node metrics",
			body: nodeMetrics,
			values: map[string]float64{
				"psp_sample_rtt_seconds_count":  12,
				"psp_sample_rtt_seconds_sum":    0.0061,
				"process_cpu_seconds_total":     3.25,
				"process_resident_memory_bytes": 50 << 20,
				"psp_step":                      41,
			},
			hists: map[string]histogram{"psp_sample_rtt_seconds": {
				le:    []float64{0.0001, 0.0002, 0.0004, math.Inf(1)},
				count: []float64{0, 4, 10, 12},
			}},
		},
		{
			name:   "buckets out of order",
			body:   "# TYPE h histogram\n" + `h_bucket{le="+Inf"} 3` + "\n" + `h_bucket{le="2"} 2` + "\n" + `h_bucket{le="1"} 1` + "\nh_count 3\nh_sum 2.5\n",
			values: map[string]float64{"h_count": 3, "h_sum": 2.5},
			hists:  map[string]histogram{"h": {le: []float64{1, 2, math.Inf(1)}, count: []float64{1, 2, 3}}},
		},
		{
			name:   "empty body",
			body:   "",
			values: map[string]float64{},
			hists:  map[string]histogram{},
		},
		{name: "value not a number", body: "psp_step forty-one\n", err: "line 1"},
		{name: "unterminated labels", body: "psp_step 1\n" + `psp_x{protocol="step" 7` + "\n", err: "line 2"},
		{name: "missing value", body: "psp_step\n", err: "line 1"},
		{name: "negative bucket", body: "# TYPE h histogram\n" + `h_bucket{le="1"} -1` + "\n", err: "negative bucket"},
		{name: "cut off", body: "psp_step 1\nprocess_cpu", err: "metrics:"},
		{name: "not the text format", body: `{"step": 41}`, err: "metrics:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := parseMetrics(strings.NewReader(tc.body))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("parseMetrics: error %v, want one containing %q", err, tc.err)
				}
				t.Log(err)
				if m.values != nil || m.hists != nil {
					t.Errorf("parseMetrics: metrics %+v with an error, want none", m)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseMetrics: %v", err)
			}
			if !reflect.DeepEqual(m.values, tc.values) {
				t.Errorf("values %v, want %v", m.values, tc.values)
			}
			if !reflect.DeepEqual(m.hists, tc.hists) {
				t.Errorf("histograms %v, want %v", m.hists, tc.hists)
			}
		})
	}
}

func TestHistogramQuantile(t *testing.T) {
	m, err := parseMetrics(strings.NewReader(nodeMetrics))
	if err != nil {
		t.Fatal(err)
	}
	h := m.hist("psp_sample_rtt_seconds")
	for _, tc := range []struct{ q, want float64 }{
		{0.25, 0.0001 + 0.0001*(3-0)/(4-0)}, // rank 3 in (0.0001, 0.0002]
		{0.5, 0.0002 + 0.0002*(6-4)/(10-4)}, // rank 6 in (0.0002, 0.0004]
		{0.99, 0.0004},                      // rank in +Inf: the largest finite bound
	} {
		if got := h.quantile(tc.q); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("quantile(%v) = %v, want %v", tc.q, got, tc.want)
		}
	}
	if got := m.hist("psp_barrier_wait_seconds").quantile(0.5); !math.IsNaN(got) {
		t.Errorf("quantile of a missing histogram = %v, want NaN", got)
	}
}
