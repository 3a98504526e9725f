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
	"github.com/pspnode/pspnode/testnet/report"
)

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
func (t *testnet) resources(end resourceSample, now time.Duration) *report.Resources {
	q := t.quarter
	if q == nil {
		return nil
	}
	r := &report.Resources{
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
		if m.leftAt >= 0 && now-m.leftAt >= report.DepartedGrace {
			r.Departed++
			r.GoroutinesOfDeparted += byNode[m.idx]
		}
	}
	return r
}
