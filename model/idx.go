package model

import (
	"bufio"
	"compress/gzip"
	"embed"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// MaxIDXBytes caps the payload of one IDX file (the product of its
// dimensions). The full MNIST training images take 47 MB. A header that
// declares more is rejected before anything is allocated, and the payload
// buffer grows only as data actually arrives, so a hostile or truncated
// file cannot make the reader allocate much more than its real size.
const MaxIDXBytes = 256 << 20

// maxIDXDims caps the number of dimensions of an IDX file. MNIST uses 1
// (labels) and 3 (images).
const maxIDXDims = 4

// ErrInvalidIDX is wrapped by every error ReadIDX returns for malformed
// input. Truncated input also wraps io.ErrUnexpectedEOF.
var ErrInvalidIDX = errors.New("invalid IDX data")

// IDX is the content of an IDX file of unsigned bytes (element type 0x08,
// the only type MNIST uses): its dimensions and its row-major payload.
type IDX struct {
	Dims []int
	Data []byte
}

// ReadIDX reads one IDX file of unsigned bytes from r. The input may be raw
// or gzip-compressed; gzip is detected by its magic bytes 1f 8b. It rejects,
// with an error wrapping ErrInvalidIDX: a wrong magic number, an element
// type other than 0x08, 0 or more than 4 dimensions, a zero dimension, a
// payload larger than MaxIDXBytes, a payload shorter than the header
// declares (also wrapping io.ErrUnexpectedEOF), trailing bytes after the
// payload, and corrupt gzip data.
func ReadIDX(r io.Reader) (*IDX, error) {
	br := bufio.NewReader(r)
	if magic, err := br.Peek(2); err == nil && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("%w: gzip header: %w", ErrInvalidIDX, err)
		}
		defer zr.Close()
		zr.Multistream(false)
		return readIDX(zr)
	}
	return readIDX(br)
}

func readIDX(r io.Reader) (*IDX, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, fmt.Errorf("%w: reading magic number: %w", ErrInvalidIDX, eofIsUnexpected(err))
	}
	if hdr[0] != 0 || hdr[1] != 0 {
		return nil, fmt.Errorf("%w: bad magic number % x (want 00 00 08 <ndims>)", ErrInvalidIDX, hdr)
	}
	if hdr[2] != 0x08 {
		return nil, fmt.Errorf("%w: element type 0x%02x not supported (want 0x08, unsigned byte)", ErrInvalidIDX, hdr[2])
	}
	nd := int(hdr[3])
	if nd < 1 || nd > maxIDXDims {
		return nil, fmt.Errorf("%w: %d dimensions (want 1 to %d)", ErrInvalidIDX, nd, maxIDXDims)
	}
	raw := make([]byte, 4*nd)
	if _, err := io.ReadFull(r, raw); err != nil {
		return nil, fmt.Errorf("%w: reading %d dimensions: %w", ErrInvalidIDX, nd, eofIsUnexpected(err))
	}
	dims := make([]int, nd)
	size := int64(1)
	for i := range dims {
		d := int64(binary.BigEndian.Uint32(raw[4*i:]))
		if d == 0 {
			return nil, fmt.Errorf("%w: dimension %d is zero", ErrInvalidIDX, i)
		}
		if d > MaxIDXBytes || size*d > MaxIDXBytes {
			return nil, fmt.Errorf("%w: dimensions %v declare more than %d bytes", ErrInvalidIDX,
				headerDims(raw), MaxIDXBytes)
		}
		size *= d
		dims[i] = int(d)
	}
	data, err := readUpTo(r, size+1)
	if err != nil {
		return nil, fmt.Errorf("%w: reading payload: %w", ErrInvalidIDX, err)
	}
	switch {
	case int64(len(data)) < size:
		return nil, fmt.Errorf("%w: truncated: payload has %d bytes, header %v declares %d: %w",
			ErrInvalidIDX, len(data), dims, size, io.ErrUnexpectedEOF)
	case int64(len(data)) > size:
		return nil, fmt.Errorf("%w: trailing data after the %d-byte payload declared by header %v", ErrInvalidIDX, size, dims)
	}
	return &IDX{Dims: dims, Data: data}, nil
}

// readUpTo reads until EOF or n bytes, growing its buffer as data arrives.
func readUpTo(r io.Reader, n int64) ([]byte, error) {
	buf := make([]byte, 0, min(n, 1<<20))
	for int64(len(buf)) < n {
		if len(buf) == cap(buf) {
			grown := make([]byte, len(buf), min(n, 2*int64(cap(buf))))
			copy(grown, buf)
			buf = grown
		}
		m, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+m]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, eofIsUnexpected(err)
		}
	}
	return buf, nil
}

func headerDims(raw []byte) []uint32 {
	d := make([]uint32, len(raw)/4)
	for i := range d {
		d[i] = binary.BigEndian.Uint32(raw[4*i:])
	}
	return d
}

func eofIsUnexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// ReadIDXFile reads an IDX file (raw or gzip) from path.
func ReadIDXFile(path string) (*IDX, error) {
	return readIDXFS(os.DirFS(filepath.Dir(path)), filepath.Base(path), path)
}

// MNISTClasses is the number of MNIST classes (digits 0 to 9).
const MNISTClasses = 10

// NewIDXDataset builds a classification dataset from an images file (3
// dimensions: count, rows, cols) and a labels file (1 dimension: count,
// each label < classes). Pixels are scaled from 0..255 to [0, 1].
func NewIDXDataset(name string, images, labels *IDX, classes int) (*Dataset, error) {
	if images == nil || labels == nil {
		return nil, fmt.Errorf("model: %s: nil images or labels", name)
	}
	if classes < 2 || classes > 256 {
		return nil, fmt.Errorf("model: %s: %d classes, want 2 to 256", name, classes)
	}
	if len(images.Dims) != 3 {
		return nil, fmt.Errorf("model: %s: images have dimensions %v, want 3 (count, rows, cols)", name, images.Dims)
	}
	if len(labels.Dims) != 1 {
		return nil, fmt.Errorf("model: %s: labels have dimensions %v, want 1 (count)", name, labels.Dims)
	}
	n := images.Dims[0]
	if labels.Dims[0] != n {
		return nil, fmt.Errorf("model: %s: %d images but %d labels", name, n, labels.Dims[0])
	}
	dim := images.Dims[1] * images.Dims[2]
	ds := &Dataset{Name: name, Dim: dim, Classes: classes, X: make([]float64, n*dim), Labels: make([]int, n)}
	for i, y := range labels.Data {
		if int(y) >= classes {
			return nil, fmt.Errorf("model: %s: label %d of example %d is not below %d", name, y, i, classes)
		}
		ds.Labels[i] = int(y)
	}
	for i, p := range images.Data {
		ds.X[i] = float64(p) / 255
	}
	return ds, nil
}

// LoadMNIST loads MNIST-format IDX files (raw or .gz) from dir. It looks for
// the standard names train-images-idx3-ubyte, train-labels-idx1-ubyte,
// t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte, each optionally with a
// ".gz" suffix and with "." in place of the "-" before "idx".
//
// With both the train and the t10k files, Train is the training set and Test
// the t10k set. With only one of them (as the embedded set, EmbeddedMNIST,
// which is t10k only), that set is split deterministically: example i is
// held out for evaluation iff i mod 5 == 4, and used for training otherwise.
// For t10k that gives 8000 training and 2000 held-out images. Interleaving,
// rather than taking the last fifth, keeps both halves of t10k (the first
// 5000 are written by Census employees, the last 5000 by students, and are
// harder) in both parts.
func LoadMNIST(dir string) (Data, error) {
	return loadMNISTFS(os.DirFS(dir), dir)
}

// The official MNIST test set (t10k), gzip-compressed as distributed; see
// mnist/README.md for its origin and licence.
//
//go:embed mnist/t10k-images-idx3-ubyte.gz mnist/t10k-labels-idx1-ubyte.gz
var embeddedMNIST embed.FS

// EmbeddedMNIST returns the official MNIST test set (10 000 images), which
// this package embeds so that nothing has to be downloaded, split as
// LoadMNIST splits a single set: 8000 training and 2000 held-out images,
// named mnist-t10k/train and mnist-t10k/heldout. The data spec "mnist"
// (Open) means this set. It decompresses 1.6 MB and returns about 63 MB of
// float64 pixels; each call builds a fresh copy.
func EmbeddedMNIST() (Data, error) {
	sub, err := fs.Sub(embeddedMNIST, "mnist")
	if err != nil {
		return Data{}, fmt.Errorf("model: embedded MNIST: %w", err)
	}
	return loadMNISTFS(sub, "(embedded)")
}

// loadMNISTFS is LoadMNIST on the files of fsys; where names fsys in errors.
func loadMNISTFS(fsys fs.FS, where string) (Data, error) {
	train, trainErr := loadMNISTPair(fsys, where, "train")
	test, testErr := loadMNISTPair(fsys, where, "t10k")
	switch {
	case trainErr == nil && testErr == nil:
		return Data{Train: train, Test: test}, nil
	case trainErr == nil && errors.Is(testErr, fs.ErrNotExist):
		return splitHeldOut(train), nil
	case testErr == nil && errors.Is(trainErr, fs.ErrNotExist):
		return splitHeldOut(test), nil
	case trainErr != nil && !errors.Is(trainErr, fs.ErrNotExist):
		return Data{}, trainErr
	case testErr != nil && !errors.Is(testErr, fs.ErrNotExist):
		return Data{}, testErr
	}
	return Data{}, fmt.Errorf("model: no MNIST files in %s (want train-images-idx3-ubyte[.gz] and train-labels-idx1-ubyte[.gz], or the t10k pair): %w",
		where, fs.ErrNotExist)
}

// HeldOutEvery is the MNIST split rule's period: with a single set of
// files, example i is held out iff i % HeldOutEvery == HeldOutEvery-1.
const HeldOutEvery = 5

func splitHeldOut(ds *Dataset) Data {
	var tr, te []int
	for i := range ds.Len() {
		if i%HeldOutEvery == HeldOutEvery-1 {
			te = append(te, i)
		} else {
			tr = append(tr, i)
		}
	}
	train, test := ds.Subset(tr), ds.Subset(te)
	train.Name, test.Name = ds.Name+"/train", ds.Name+"/heldout"
	return Data{Train: train, Test: test}
}

func loadMNISTPair(fsys fs.FS, where, prefix string) (*Dataset, error) {
	imgName, err := findIDX(fsys, where, prefix, "images-idx3-ubyte", "images.idx3-ubyte")
	if err != nil {
		return nil, err
	}
	lblName, err := findIDX(fsys, where, prefix, "labels-idx1-ubyte", "labels.idx1-ubyte")
	if err != nil {
		return nil, err
	}
	images, err := readIDXFS(fsys, imgName, filepath.Join(where, imgName))
	if err != nil {
		return nil, err
	}
	labels, err := readIDXFS(fsys, lblName, filepath.Join(where, lblName))
	if err != nil {
		return nil, err
	}
	return NewIDXDataset("mnist-"+prefix, images, labels, MNISTClasses)
}

// readIDXFS reads the IDX file name of fsys; path names it in errors.
func readIDXFS(fsys fs.FS, name, path string) (*IDX, error) {
	f, err := fsys.Open(name)
	if err != nil {
		return nil, fmt.Errorf("model: %s: %w", path, err)
	}
	defer f.Close()
	idx, err := ReadIDX(f)
	if err != nil {
		return nil, fmt.Errorf("model: %s: %w", path, err)
	}
	return idx, nil
}

func findIDX(fsys fs.FS, where, prefix string, names ...string) (string, error) {
	for _, n := range names {
		for _, ext := range []string{"", ".gz"} {
			name := prefix + "-" + n + ext
			if _, err := fs.Stat(fsys, name); err == nil {
				return name, nil
			}
		}
	}
	return "", fmt.Errorf("model: %s: %w", filepath.Join(where, prefix+"-"+names[0]+"[.gz]"), fs.ErrNotExist)
}
