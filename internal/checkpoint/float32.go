package checkpoint

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"math"
	"os"
	"path/filepath"

	"github.com/pspnode/pspnode/internal/f32"
	"github.com/pspnode/pspnode/psp"
)

// The float32 checkpoint: a trainer's model, written from where it lies
// and read into where it goes, a block at a time, so that a model of
// hundreds of megabytes needs no copy of itself in memory (and half the
// file of the float64 one). Its layout is the float64 one's (doc.go) with
// magic "PSPCKPT2" and n × f32 little-endian values.

const magic32 = "PSPCKPT2"

// Header is what a checkpoint says of its model.
type Header struct {
	Job     string
	Step    psp.Step
	ModelID uint32
	N       int
}

// block is how many values Write32 and ReadInto move at a time.
const block = 1 << 16

// Write32 writes a float32 checkpoint of h.N values to path atomically,
// reading the values a block at a time from read (into dst, the values
// [lo, hi)).
func Write32(path string, h Header, read func(lo, hi int, dst []float32) error) error {
	if len(h.Job) > math.MaxUint16 {
		return fmt.Errorf("checkpoint: job name too long")
	}
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, ".checkpoint-*")
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	defer os.Remove(tmp.Name()) // a no-op once renamed
	crc := crc32.New(castagnoli)
	w := bufio.NewWriterSize(io.MultiWriter(tmp, crc), 1<<20)
	head := append([]byte(magic32), byte(len(h.Job)>>8), byte(len(h.Job)))
	head = append(head, h.Job...)
	head = binary.BigEndian.AppendUint64(head, uint64(h.Step))
	head = binary.BigEndian.AppendUint32(head, h.ModelID)
	head = binary.BigEndian.AppendUint32(head, uint32(h.N))
	_, err = w.Write(head)
	buf := make([]float32, min(block, h.N))
	for lo := 0; lo < h.N && err == nil; lo += block {
		hi := min(lo+block, h.N)
		v := buf[:hi-lo]
		if err = read(lo, hi, v); err == nil {
			if i, x := f32.First(v, f32.Limit(math.MaxFloat32)); i >= 0 {
				err = fmt.Errorf("parameter %d is %v", lo+i, x)
			}
		}
		if err == nil {
			_, err = w.Write(f32.Append(nil, v))
		}
	}
	if err == nil {
		err = w.Flush()
	}
	if err == nil {
		_, err = tmp.Write(binary.BigEndian.AppendUint32(nil, crc.Sum32()))
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// ReadInto reads the checkpoint in path, of either format, into dst (the
// model's values, which the header's n must equal) a block at a time, and
// returns its header. dst is left unspecified on an error.
func ReadInto(path string, dst []float32) (Header, error) {
	f, err := os.Open(path)
	if err != nil {
		return Header{}, fmt.Errorf("checkpoint: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return Header{}, fmt.Errorf("checkpoint: %w", err)
	}
	crc := crc32.New(castagnoli)
	r := bufio.NewReaderSize(f, 1<<20)
	size := st.Size()
	h, width, err := readHeader(r, crc)
	if err != nil {
		return Header{}, err
	}
	switch {
	case h.N != len(dst):
		return h, fmt.Errorf("%w: %d parameters, the model has %d", ErrCorrupt, h.N, len(dst))
	case size != int64(len(magic32)+2+len(h.Job)+16)+int64(width)*int64(h.N)+4:
		return h, fmt.Errorf("%w: %d bytes for %d parameters: the file is truncated or corrupt", ErrCorrupt, size, h.N)
	}
	raw := make([]byte, width*min(block, h.N))
	for lo := 0; lo < h.N; lo += block {
		hi := min(lo+block, h.N)
		b := raw[:width*(hi-lo)]
		if _, err := io.ReadFull(r, b); err != nil {
			return h, fmt.Errorf("%w: %w", ErrCorrupt, err)
		}
		crc.Write(b)
		for i := range hi - lo {
			var v float64
			if width == 4 {
				v = float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])))
			} else {
				v = math.Float64frombits(binary.BigEndian.Uint64(b[8*i:]))
			}
			if math.IsNaN(v) || math.IsInf(v, 0) || math.Abs(v) > math.MaxFloat32 {
				return h, fmt.Errorf("%w: parameter %d is %v", ErrCorrupt, lo+i, v)
			}
			dst[lo+i] = float32(v)
		}
	}
	var sum [4]byte
	if _, err := io.ReadFull(r, sum[:]); err != nil || binary.BigEndian.Uint32(sum[:]) != crc.Sum32() {
		return h, fmt.Errorf("%w: checksum mismatch: the file is truncated or corrupt", ErrCorrupt)
	}
	return h, nil
}

// ReadHeader reads the header of the checkpoint in path, of either
// format, alone: what it holds, before a reader commits to reading it.
func ReadHeader(path string) (Header, error) {
	f, err := os.Open(path)
	if err != nil {
		return Header{}, fmt.Errorf("checkpoint: %w", err)
	}
	defer f.Close()
	h, _, err := readHeader(bufio.NewReader(f), crc32.New(castagnoli))
	return h, err
}

// readHeader reads a checkpoint's header of either format, into crc too,
// and returns the width of its values (8 or 4 bytes).
func readHeader(r io.Reader, crc hash.Hash32) (Header, int, error) {
	fixed := make([]byte, len(magic)+2)
	if _, err := io.ReadFull(r, fixed); err != nil {
		return Header{}, 0, fmt.Errorf("%w: not a pspnode checkpoint (too short)", ErrCorrupt)
	}
	width := 0
	switch string(fixed[:len(magic)]) {
	case magic:
		width = 8
	case magic32:
		width = 4
	default:
		return Header{}, 0, fmt.Errorf("%w: not a pspnode checkpoint (wrong magic)", ErrCorrupt)
	}
	jl := int(binary.BigEndian.Uint16(fixed[len(magic):]))
	rest := make([]byte, jl+16)
	if _, err := io.ReadFull(r, rest); err != nil {
		return Header{}, 0, fmt.Errorf("%w: truncated header", ErrCorrupt)
	}
	crc.Write(fixed)
	crc.Write(rest)
	h := Header{Job: string(rest[:jl]), Step: psp.Step(binary.BigEndian.Uint64(rest[jl:])),
		ModelID: binary.BigEndian.Uint32(rest[jl+8:]), N: int(binary.BigEndian.Uint32(rest[jl+12:]))}
	if h.Step < 0 {
		return h, 0, fmt.Errorf("%w: negative step %d", ErrCorrupt, h.Step)
	}
	return h, width, nil
}
