package checkpoint

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestCheckpointRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ckpt")
	in := Checkpoint{Job: "j", Step: 42, ModelID: 7, Params: []float64{1, -2, 3.5}}
	if err := Write(path, in); err != nil {
		t.Fatal(err)
	}
	out, err := Read(path)
	if err != nil || out.Job != "j" || out.Step != 42 || out.ModelID != 7 || len(out.Params) != 3 || out.Params[2] != 3.5 {
		t.Fatalf("read back %+v, %v", out, err)
	}
	// Overwrite atomically: the new content replaces the old.
	in.Step = 43
	if err := Write(path, in); err != nil {
		t.Fatal(err)
	}
	if out, _ := Read(path); out.Step != 43 {
		t.Errorf("step %d after overwrite", out.Step)
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".checkpoint-*")); len(left) != 0 {
		t.Errorf("temporary files left behind: %v", left)
	}
}

func TestCheckpointCorrupt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ckpt")
	if err := Write(path, Checkpoint{Job: "j", Step: 1, ModelID: 1, Params: []float64{1, 2, 3, 4}}); err != nil {
		t.Fatal(err)
	}
	good, _ := os.ReadFile(path)
	flip := append([]byte(nil), good...)
	flip[len(flip)/2] ^= 0x40
	for name, b := range map[string][]byte{
		"truncated": good[:len(good)-5],
		"flipped":   flip,
		"empty":     {},
		"magic":     append([]byte("XXXXXXXX"), good[8:]...),
	} {
		if _, err := Parse(b); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: want ErrCorrupt, got %v", name, err)
		}
	}
	if _, err := Read(filepath.Join(t.TempDir(), "missing")); err == nil || errors.Is(err, ErrCorrupt) {
		t.Errorf("missing file: %v", err)
	}
}

func FuzzCheckpoint(f *testing.F) {
	dir := f.TempDir()
	path := filepath.Join(dir, "c")
	_ = Write(path, Checkpoint{Job: "fuzz", Step: 3, ModelID: 9, Params: []float64{0.5, 1}})
	seed, _ := os.ReadFile(path)
	f.Add(seed)
	f.Add([]byte("PSPCKPT1"))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := Parse(b)
		if err == nil && (c.Step < 0 || len(c.Params) > maxParams) {
			t.Fatalf("accepted %+v", c)
		}
	})
}
