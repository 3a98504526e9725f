package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/pspnode/pspnode/internal/netns"
)

// What a run keeps of its workers beside its figures: the daemons' last
// /metrics and /status, and the workers' own files.

// scrape reads a daemon's /metrics and /status from inside its namespace
// ("" for what could not be read).
func scrape(h *netns.Host) (metrics, status string) {
	cl := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: h.DialContext, DisableKeepAlives: true}}
	get := func(path string) string {
		resp, err := cl.Get("http://127.0.0.1:9090" + path)
		if err != nil {
			return ""
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(io.LimitReader(resp.Body, 32<<20))
		if err != nil || resp.StatusCode != http.StatusOK {
			return ""
		}
		return string(b)
	}
	return get("/metrics"), get("/status")
}

// keepScrapes saves each daemon's /metrics and /status at the end of the
// run beside the run's record (runs/NAME.dI.metrics, .dI.status.json), for
// looking into a figure later.
func (c *config) keepScrapes(cl cell, sys string, seed int, ws []*worker) {
	base := strings.TrimSuffix(c.savedPath(cl, sys, seed), ".json")
	_ = os.MkdirAll(filepath.Dir(base), 0o755)
	for i, w := range ws {
		_ = os.WriteFile(fmt.Sprintf("%s.d%d.metrics", base, i), []byte(w.metrics), 0o644)
		_ = os.WriteFile(fmt.Sprintf("%s.d%d.status.json", base, i), []byte(w.statusBody), 0o644)
	}
}

// keepWorkerFiles saves each worker's evaluations and summary beside the
// run's record (runs/NAME.wI.csv, .wI.json).
func (c *config) keepWorkerFiles(cl cell, sys string, seed int, ws []*worker) {
	base := strings.TrimSuffix(c.savedPath(cl, sys, seed), ".json")
	_ = os.MkdirAll(filepath.Dir(base), 0o755)
	for i, w := range ws {
		for ext, from := range map[string]string{"csv": w.csv, "json": w.summary} {
			if b, err := os.ReadFile(from); err == nil {
				_ = os.WriteFile(fmt.Sprintf("%s.w%d.%s", base, i, ext), b, 0o644)
			}
		}
	}
}

// summary is what mnist.py writes at the end (--summary).
type summary struct {
	Steps       int64   `json:"steps"`
	Elapsed     float64 `json:"elapsed_s"`
	Final       float64 `json:"final_accuracy"`
	StartLate   float64 `json:"start_late_s"`
	CPU         float64 `json:"cpu_s"`
	ComputeCPU  float64 `json:"cpu_compute_s"`
	StepCPU     float64 `json:"cpu_step_s"`
	EvalCPU     float64 `json:"cpu_eval_s"`
	Evaluations int64   `json:"evaluations"`
	StepWall    float64 `json:"step_wall_s"`
	EvalWall    float64 `json:"eval_wall_s"`
	RunQueue    float64 `json:"run_queue_s"`
	FirstStep   float64 `json:"first_step_unix"`
}
