// Package evals reads the evaluations that examples/torch/mnist.py writes
// (--out): a CSV of time_s,step,loss,accuracy, one line per evaluation.
// The DDP comparison and the trainer tests read them alike.
package evals

import (
	"bufio"
	"os"
	"strconv"
	"strings"
)

// Eval is one evaluation of a worker's model.
type Eval struct {
	Time     float64 // seconds since the worker's start
	Step     float64 // the worker's step
	Accuracy float64 // held-out accuracy
}

// Read returns the evaluations in path so far; lines that do not parse
// (the header, a line being written) are skipped.
func Read(path string) ([]Eval, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []Eval
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Split(sc.Text(), ",")
		if len(fs) != 4 {
			continue
		}
		t, e1 := strconv.ParseFloat(fs[0], 64)
		s, e2 := strconv.ParseFloat(fs[1], 64)
		a, e3 := strconv.ParseFloat(fs[3], 64)
		if e1 == nil && e2 == nil && e3 == nil {
			out = append(out, Eval{Time: t, Step: s, Accuracy: a})
		}
	}
	return out, sc.Err()
}
