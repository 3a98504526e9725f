package checkpoint

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
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

// A float32 checkpoint is written from a source and read into a
// destination a block at a time; every reader takes both formats, and a
// truncated or corrupt file, or one of another size, is an error.
func TestCheckpoint32(t *testing.T) {
	dir := t.TempDir()
	n := 3*block + 5
	src := make([]float32, n)
	for i := range src {
		src[i] = float32(i%97) - 48.5
	}
	path := filepath.Join(dir, "ckpt32")
	read := func(lo, hi int, dst []float32) error { copy(dst, src[lo:hi]); return nil }
	if err := Write32(path, Header{Job: "j", Step: 9, ModelID: 3, N: n}, read); err != nil {
		t.Fatal(err)
	}
	dst := make([]float32, n)
	h, err := ReadInto(path, dst)
	if err != nil || h.Job != "j" || h.Step != 9 || h.ModelID != 3 || h.N != n || !slices.Equal(dst, src) {
		t.Fatalf("read back %+v, %v", h, err)
	}
	if c, err := Read(path); err != nil || len(c.Params) != n || c.Params[7] != float64(src[7]) {
		t.Fatalf("the float64 reader: %v", err)
	}
	// The float64 file reads into float32 too.
	p64 := filepath.Join(dir, "ckpt64")
	if err := Write(p64, Checkpoint{Job: "j", Step: 2, ModelID: 3, Params: []float64{1, -2.5, 3}}); err != nil {
		t.Fatal(err)
	}
	small := make([]float32, 3)
	if h, err := ReadInto(p64, small); err != nil || h.Step != 2 || small[1] != -2.5 {
		t.Fatalf("a float64 file: %+v %v %v", h, small, err)
	}
	if _, err := ReadInto(p64, make([]float32, 4)); !errors.Is(err, ErrCorrupt) {
		t.Errorf("another size: %v", err)
	}
	b, _ := os.ReadFile(path)
	for name, bad := range map[string][]byte{"truncated": b[:len(b)-9], "flipped": flip(b, len(b)/2)} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, bad, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadInto(p, make([]float32, n)); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v", name, err)
		}
	}
	// A source with a value not finite is refused, and nothing replaces
	// the file.
	bad := func(lo, hi int, dst []float32) error { copy(dst, src[lo:hi]); dst[0] = float32(math.NaN()); return nil }
	if err := Write32(path, Header{Job: "j", Step: 10, ModelID: 3, N: n}, bad); err == nil {
		t.Error("a NaN was written")
	}
	if h, _ := ReadInto(path, dst); h.Step != 9 {
		t.Errorf("the checkpoint is at step %d after a refused write", h.Step)
	}
}

func flip(b []byte, i int) []byte {
	c := append([]byte(nil), b...)
	c[i] ^= 0x40
	return c
}
