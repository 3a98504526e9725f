package model

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// idxBytes encodes an IDX file of unsigned bytes.
func idxBytes(dims []uint32, data []byte) []byte {
	var b bytes.Buffer
	b.Write([]byte{0, 0, 0x08, byte(len(dims))})
	for _, d := range dims {
		binary.Write(&b, binary.BigEndian, d)
	}
	b.Write(data)
	return b.Bytes()
}

func gzipBytes(p []byte) []byte {
	var b bytes.Buffer
	w := gzip.NewWriter(&b)
	w.Write(p)
	w.Close()
	return b.Bytes()
}

func TestReadIDXGood(t *testing.T) {
	payload := []byte{0, 1, 2, 3, 4, 5, 250, 251, 252, 253, 254, 255}
	raw := idxBytes([]uint32{2, 2, 3}, payload)
	for name, in := range map[string][]byte{"raw": raw, "gzip": gzipBytes(raw)} {
		idx, err := ReadIDX(bytes.NewReader(in))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(idx.Dims) != 3 || idx.Dims[0] != 2 || idx.Dims[1] != 2 || idx.Dims[2] != 3 {
			t.Errorf("%s: dims %v, want [2 2 3]", name, idx.Dims)
		}
		if !bytes.Equal(idx.Data, payload) {
			t.Errorf("%s: data %v, want %v", name, idx.Data, payload)
		}
	}
}

func TestReadIDXBad(t *testing.T) {
	good := idxBytes([]uint32{3, 2}, []byte{1, 2, 3, 4, 5, 6})
	gz := gzipBytes(good)
	badCRC := append([]byte(nil), gz...)
	badCRC[len(badCRC)-6] ^= 0xff // flip a byte of the CRC-32
	tests := []struct {
		name      string
		in        []byte
		want      string
		truncated bool
	}{
		{"empty", nil, "reading magic number", true},
		{"short magic", []byte{0, 0}, "reading magic number", true},
		{"bad magic", []byte{1, 2, 8, 1, 0, 0, 0, 1, 0}, "bad magic number", false},
		{"float type", []byte{0, 0, 0x0d, 1, 0, 0, 0, 1, 0, 0, 0, 0}, "element type 0x0d", false},
		{"zero dims", []byte{0, 0, 8, 0}, "0 dimensions", false},
		{"five dims", []byte{0, 0, 8, 5}, "5 dimensions", false},
		{"short dims", []byte{0, 0, 8, 3, 0, 0, 0, 1, 0, 0}, "reading 3 dimensions", true},
		{"zero dimension", idxBytes([]uint32{0, 5}, nil), "dimension 0 is zero", false},
		{"huge dimension", idxBytes([]uint32{0xffffffff}, nil), "declare more than", false},
		{"huge product", idxBytes([]uint32{60000, 60000, 60000}, nil), "declare more than", false},
		{"truncated payload", good[:len(good)-1], "truncated: payload has 5 bytes", true},
		{"no payload", good[:12], "truncated: payload has 0 bytes", true},
		{"trailing data", append(append([]byte(nil), good...), 7), "trailing data", false},
		{"truncated gzip", gz[:len(gz)-10], "reading payload", true},
		{"gzip header only", gz[:5], "gzip header", true},
		{"gzip bad checksum", badCRC, "checksum", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadIDX(bytes.NewReader(tc.in))
			if err == nil {
				t.Fatal("no error")
			}
			if !errors.Is(err, ErrInvalidIDX) {
				t.Errorf("error %q does not wrap ErrInvalidIDX", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want it to contain %q", err, tc.want)
			}
			if tc.truncated && !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Errorf("error %q does not wrap io.ErrUnexpectedEOF", err)
			}
		})
	}
}

// writeMNIST writes an images and a labels file for n tiny 2×3 images
// whose pixels encode the example index, and label i%10.
func writeMNIST(t *testing.T, dir, prefix string, n int, gz bool) {
	t.Helper()
	pix := make([]byte, n*6)
	lab := make([]byte, n)
	for i := range n {
		for j := range 6 {
			pix[i*6+j] = byte(i)
		}
		lab[i] = byte(i % 10)
	}
	files := map[string][]byte{
		prefix + "-images-idx3-ubyte": idxBytes([]uint32{uint32(n), 2, 3}, pix),
		prefix + "-labels-idx1-ubyte": idxBytes([]uint32{uint32(n)}, lab),
	}
	for name, b := range files {
		if gz {
			name, b = name+".gz", gzipBytes(b)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestLoadMNISTSplit(t *testing.T) {
	dir := t.TempDir()
	writeMNIST(t, dir, "t10k", 23, true)
	d, err := LoadMNIST(dir)
	if err != nil {
		t.Fatal(err)
	}
	if d.Train.Len() != 19 || d.Test.Len() != 4 || d.Train.Dim != 6 || d.Train.Classes != 10 {
		t.Fatalf("train %d×%d, test %d: want 19×6 and 4", d.Train.Len(), d.Train.Dim, d.Test.Len())
	}
	for k := range d.Test.Len() {
		i := 5*k + 4 // held out: i mod 5 == 4
		if want := float64(i) / 255; d.Test.Row(k)[0] != want || d.Test.Labels[k] != i%10 {
			t.Errorf("held-out %d: pixel %v label %d, want example %d", k, d.Test.Row(k)[0], d.Test.Labels[k], i)
		}
	}
	for _, ds := range []*Dataset{d.Train, d.Test} {
		if err := ds.Validate(); err != nil {
			t.Error(err)
		}
	}
}

func TestLoadMNISTTrainAndTest(t *testing.T) {
	dir := t.TempDir()
	writeMNIST(t, dir, "train", 30, false)
	writeMNIST(t, dir, "t10k", 10, true)
	d, err := LoadMNIST(dir)
	if err != nil {
		t.Fatal(err)
	}
	if d.Train.Len() != 30 || d.Test.Len() != 10 {
		t.Errorf("train %d, test %d: want 30 and 10", d.Train.Len(), d.Test.Len())
	}
}

func TestLoadMNISTErrors(t *testing.T) {
	empty := t.TempDir()
	if _, err := LoadMNIST(empty); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("empty dir: error %v, want fs.ErrNotExist", err)
	}

	mismatch := t.TempDir()
	writeMNIST(t, mismatch, "t10k", 10, false)
	os.WriteFile(filepath.Join(mismatch, "t10k-labels-idx1-ubyte"), idxBytes([]uint32{9}, make([]byte, 9)), 0o644)
	if _, err := LoadMNIST(mismatch); err == nil || !strings.Contains(err.Error(), "10 images but 9 labels") {
		t.Errorf("count mismatch: error %v", err)
	}

	badLabel := t.TempDir()
	writeMNIST(t, badLabel, "t10k", 10, false)
	os.WriteFile(filepath.Join(badLabel, "t10k-labels-idx1-ubyte"), idxBytes([]uint32{10}, bytes.Repeat([]byte{10}, 10)), 0o644)
	if _, err := LoadMNIST(badLabel); err == nil || !strings.Contains(err.Error(), "not below 10") {
		t.Errorf("label 10: error %v", err)
	}

	truncated := t.TempDir()
	writeMNIST(t, truncated, "t10k", 10, false)
	p := filepath.Join(truncated, "t10k-images-idx3-ubyte")
	b, _ := os.ReadFile(p)
	os.WriteFile(p, b[:len(b)-3], 0o644)
	if _, err := LoadMNIST(truncated); !errors.Is(err, io.ErrUnexpectedEOF) || !strings.Contains(err.Error(), p) {
		t.Errorf("truncated: error %v, want io.ErrUnexpectedEOF naming %s", err, p)
	}

	// A corrupt training set is an error even when the t10k set is fine.
	corrupt := t.TempDir()
	writeMNIST(t, corrupt, "t10k", 10, false)
	os.WriteFile(filepath.Join(corrupt, "train-images-idx3-ubyte"), []byte("not an idx file"), 0o644)
	os.WriteFile(filepath.Join(corrupt, "train-labels-idx1-ubyte"), idxBytes([]uint32{1}, []byte{1}), 0o644)
	if _, err := LoadMNIST(corrupt); !errors.Is(err, ErrInvalidIDX) {
		t.Errorf("corrupt train: error %v, want ErrInvalidIDX", err)
	}

	twoDimImages := t.TempDir()
	os.WriteFile(filepath.Join(twoDimImages, "t10k-images-idx3-ubyte"), idxBytes([]uint32{2, 3}, make([]byte, 6)), 0o644)
	os.WriteFile(filepath.Join(twoDimImages, "t10k-labels-idx1-ubyte"), idxBytes([]uint32{2}, []byte{1, 2}), 0o644)
	if _, err := LoadMNIST(twoDimImages); err == nil || !strings.Contains(err.Error(), "want 3") {
		t.Errorf("2-D images: error %v", err)
	}
}

func FuzzReadIDX(f *testing.F) {
	good := idxBytes([]uint32{3, 2, 2}, []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12})
	f.Add(good)
	f.Add(gzipBytes(good))
	f.Add(idxBytes([]uint32{4}, []byte{0, 1, 2, 9}))
	f.Add(good[:len(good)-2])
	f.Add([]byte{0, 0, 8, 1, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0x1f, 0x8b})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, in []byte) {
		idx, err := ReadIDX(bytes.NewReader(in))
		if err != nil {
			if !errors.Is(err, ErrInvalidIDX) {
				t.Fatalf("error %v does not wrap ErrInvalidIDX", err)
			}
			return
		}
		size := 1
		for _, d := range idx.Dims {
			if d < 1 {
				t.Fatalf("dimension %d accepted", d)
			}
			size *= d
		}
		if size != len(idx.Data) || size > MaxIDXBytes {
			t.Fatalf("dims %v but %d bytes", idx.Dims, len(idx.Data))
		}
		if len(idx.Dims) == 3 {
			labels := &IDX{Dims: idx.Dims[:1], Data: make([]byte, idx.Dims[0])}
			if _, err := NewIDXDataset("fuzz", idx, labels, MNISTClasses); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// The embedded set is the official t10k set, split 8000 / 2000, with
// pixels in [0, 1] and every class present; read from the same files on
// disk (mnist:DIR) it gives the same data.
func TestEmbeddedMNIST(t *testing.T) {
	d := loadMNIST(t)
	if d.Train.Len() != 8000 || d.Test.Len() != 2000 || d.Train.Dim != 784 || d.Train.Classes != 10 {
		t.Fatalf("train %d×%d, held-out %d: want 8000×784 and 2000", d.Train.Len(), d.Train.Dim, d.Test.Len())
	}
	if d.Train.Name != "mnist-t10k/train" || d.Test.Name != "mnist-t10k/heldout" {
		t.Errorf("names %q and %q", d.Train.Name, d.Test.Name)
	}
	for _, ds := range []*Dataset{d.Train, d.Test} {
		if err := ds.Validate(); err != nil {
			t.Error(err)
		}
		lo, hi := ds.X[0], ds.X[0]
		for _, v := range ds.X {
			lo, hi = min(lo, v), max(hi, v)
		}
		if lo != 0 || hi != 1 {
			t.Errorf("%s: pixels in [%v, %v], want [0, 1]", ds.Name, lo, hi)
		}
		count := make([]int, 10)
		for _, y := range ds.Labels {
			count[y]++
		}
		for c, k := range count {
			if k < ds.Len()/20 {
				t.Errorf("%s: class %d has only %d examples", ds.Name, c, k)
			}
		}
	}
	// The first test image is a 7, as in every copy of t10k.
	if d.Train.Labels[0] != 7 {
		t.Errorf("first label %d, want 7", d.Train.Labels[0])
	}
	disk, err := Open("mnist:" + mnistDir)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(disk.Train.X, d.Train.X) || !slices.Equal(disk.Test.Labels, d.Test.Labels) {
		t.Error("the embedded set and the same files read from disk differ")
	}
}

// mnistDir holds the embedded MNIST files on disk, relative to this package.
const mnistDir = "mnist"

func TestReadIDXFile(t *testing.T) {
	idx, err := ReadIDXFile(filepath.Join("mnist", "t10k-labels-idx1-ubyte.gz"))
	if err != nil || len(idx.Dims) != 1 || idx.Dims[0] != 10000 {
		t.Fatalf("labels: %+v, %v; want 10000 labels", idx, err)
	}
	missing := filepath.Join(t.TempDir(), "none.gz")
	if _, err := ReadIDXFile(missing); err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("missing file: err %v, want one naming %s", err, missing)
	}
}
