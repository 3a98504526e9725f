package testnet

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/pspnode/pspnode/internal/procstat"
)

// Resources is what the testnet process held at a quarter of the training
// time and at its end, for long runs that look for slow leaks: a leak
// shows as a count that grows between the two while the live population
// stays about the same.
//
// Heap is the live heap after a forced collection (the collector's
// growth target would otherwise make it swing by a factor of GOGC/100).
// Stacks are the goroutines' stacks, which the heap does not count: at
// a thousand nodes, most of a node's goroutines wait on idle streams.
// The goroutine figures count every goroutine of the process; the per
// node figure divides them by the live nodes. GoroutinesOfDeparted counts
// goroutines still running at the end on behalf of nodes that left or
// crashed at least DepartedGrace earlier: each node's goroutines carry a
// pprof label with its number, inherited by every goroutine they start.
// Goroutines that a peer starts to serve a node carry the peer's label,
// so this counts what a departed node itself left running.
type Resources struct {
	RSSBytesAtQuarter        int64   `json:"rss_bytes_at_quarter"`
	RSSBytesEnd              int64   `json:"rss_bytes_end"`
	HeapBytesAtQuarter       uint64  `json:"heap_bytes_at_quarter"`
	HeapBytesEnd             uint64  `json:"heap_bytes_end"`
	StackBytesAtQuarter      uint64  `json:"stack_bytes_at_quarter"`
	StackBytesEnd            uint64  `json:"stack_bytes_end"`
	GoroutinesAtQuarter      int     `json:"goroutines_at_quarter"`
	GoroutinesEnd            int     `json:"goroutines_end"`
	LiveAtQuarter            int     `json:"live_at_quarter"`
	LiveEnd                  int     `json:"live_end"`
	GoroutinesPerNodeQuarter float64 `json:"goroutines_per_node_at_quarter"`
	GoroutinesPerNodeEnd     float64 `json:"goroutines_per_node_end"`
	Departed                 int     `json:"departed"` // nodes gone at least DepartedGrace before the end
	GoroutinesOfDeparted     int     `json:"goroutines_of_departed"`
}

// DepartedGrace is how long after a node leaves its goroutines may still
// wind down (bounded library sleeps, in-flight stream deadlines) before
// Resources counts them as left over.
const DepartedGrace = 30 * time.Second

// nodeLabel is the pprof label that names the node a goroutine works for.
const nodeLabel = "psp_node"

// asNode runs f with the goroutine labelled as node idx's, so every
// goroutine f starts (and they start) is counted as that node's.
func asNode(idx int, f func()) {
	pprof.Do(context.Background(), pprof.Labels(nodeLabel, strconv.Itoa(idx)), func(context.Context) { f() })
}

// resourceSample is one reading of the process.
type resourceSample struct {
	rss        int64
	heap       uint64
	stack      uint64
	goroutines int
	live       int
}

// sampleResources reads the process after a forced collection.
func sampleResources(live int) resourceSample {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return resourceSample{rss: procstat.RSS(), heap: ms.HeapAlloc, stack: ms.StackInuse, goroutines: runtime.NumGoroutine(), live: live}
}

// goroutinesByNode counts the running goroutines by their node label.
func goroutinesByNode() map[int]int {
	var buf bytes.Buffer
	if err := pprof.Lookup("goroutine").WriteTo(&buf, 1); err != nil {
		return nil
	}
	return parseGoroutineLabels(&buf)
}

// parseGoroutineLabels reads a goroutine profile in its debug=1 text form:
// each stack starts with "N @ addresses" and may be followed by a line
// "# labels: {...}" with the labels as JSON.
func parseGoroutineLabels(r *bytes.Buffer) map[int]int {
	counts := map[int]int{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	n := 0
	for sc.Scan() {
		line := sc.Text()
		if before, _, ok := strings.Cut(line, " @ "); ok && !strings.HasPrefix(line, "#") {
			n, _ = strconv.Atoi(before)
			continue
		}
		js, ok := strings.CutPrefix(line, "# labels: ")
		if !ok {
			continue
		}
		var labels map[string]string
		if json.Unmarshal([]byte(js), &labels) != nil {
			continue
		}
		if idx, err := strconv.Atoi(labels[nodeLabel]); err == nil {
			counts[idx] += n
		}
	}
	return counts
}

// resources assembles the report from the quarter and end samples and
// counts what departed nodes left running. t.mu must not be held.
func (t *testnet) resources(end resourceSample, now time.Duration) *Resources {
	q := t.quarter
	if q == nil {
		return nil
	}
	r := &Resources{
		RSSBytesAtQuarter: q.rss, RSSBytesEnd: end.rss,
		HeapBytesAtQuarter: q.heap, HeapBytesEnd: end.heap,
		StackBytesAtQuarter: q.stack, StackBytesEnd: end.stack,
		GoroutinesAtQuarter: q.goroutines, GoroutinesEnd: end.goroutines,
		LiveAtQuarter: q.live, LiveEnd: end.live,
	}
	if q.live > 0 {
		r.GoroutinesPerNodeQuarter = float64(q.goroutines) / float64(q.live)
	}
	if end.live > 0 {
		r.GoroutinesPerNodeEnd = float64(end.goroutines) / float64(end.live)
	}
	byNode := goroutinesByNode()
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, m := range t.members {
		if m.leftAt >= 0 && now-m.leftAt >= DepartedGrace {
			r.Departed++
			r.GoroutinesOfDeparted += byNode[m.idx]
		}
	}
	return r
}
