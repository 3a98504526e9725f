package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/pspnode/pspnode/internal/builtin"
	"github.com/pspnode/pspnode/model"
)

// docs/protocols.md, section 7.5, tabulates the model string, model id and
// parameter count of every built-in model on every built-in data set, for
// peers written in other languages. Each row must be what `pspnode run
// --model M --data D` builds (the same openData and node.NewTask).
func TestProtocolsModelIDTable(t *testing.T) {
	b, err := os.ReadFile("../../docs/protocols.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(b), "\n--model    --data")
	if !ok {
		t.Fatal("docs/protocols.md has no model-id table (a code block starting with '--model    --data')")
	}
	table, _, _ = strings.Cut(table, "```")
	rows := strings.Split(strings.TrimSpace(table), "\n")[1:] // after the header's rest
	if len(rows) < 8 {
		t.Fatalf("%d rows in the model-id table, want one per model and data set", len(rows))
	}
	seen := map[string]bool{}
	opened := map[string]model.Data{} // MNIST is opened once
	for _, row := range rows {
		// Columns are separated by two or more spaces; the model string
		// has single spaces in it.
		var cols []string
		for _, c := range strings.Split(row, "  ") {
			if c = strings.TrimSpace(c); c != "" {
				cols = append(cols, c)
			}
		}
		if len(cols) != 5 {
			t.Errorf("row %q: %d columns, want 5", row, len(cols))
			continue
		}
		name, data, str := cols[0], strings.Split(cols[1], ",")[0], cols[2]
		if data == "(any)" {
			data = "synthetic"
		}
		seen[name] = true
		ds, ok := opened[name+" "+data]
		if !ok && name != "linreg" && name != "none" {
			ds, ok = opened["logreg "+data] // the same data for every classifier
		}
		if !ok {
			if ds, err = openData(name, data); err != nil {
				t.Errorf("row %q: %v", row, err)
				continue
			}
			opened[name+" "+data] = ds
		}
		task, err := builtin.New(builtin.Spec{Model: name, Shards: 1, SGD: model.DefaultSGDConfig()}, ds)
		if err != nil {
			t.Errorf("row %q: %v", row, err)
			continue
		}
		if name != "none" {
			m, err := model.New(name, ds.Train.Dim, ds.Train.Classes)
			if err != nil {
				t.Fatal(err)
			}
			if got := m.Name() + "|" + m.Shape().String(); got != str {
				t.Errorf("row %q: the model string is %q", row, got)
			}
		}
		if got := fmt.Sprintf("%#08x", task.ModelID()); got != cols[3] {
			t.Errorf("row %q: the model id is %s", row, got)
		}
		if got := strconv.Itoa(task.NumParams()); got != cols[4] {
			t.Errorf("row %q: %s parameters", row, got)
		}
	}
	for _, m := range []string{"none", "linreg", "logreg", "mlp"} {
		if !seen[m] {
			t.Errorf("the table has no row for --model %s", m)
		}
	}
}
