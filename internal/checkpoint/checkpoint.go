package checkpoint

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"os"
	"path/filepath"

	"github.com/pspnode/pspnode/psp"
)

const magic = "PSPCKPT1"

// ErrCorrupt is wrapped by every error about a checkpoint's content.
var ErrCorrupt = errors.New("bad checkpoint")

// Checkpoint is what a checkpoint file holds.
type Checkpoint struct {
	Job     string
	Step    psp.Step
	ModelID uint32
	Params  []float64
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Write writes c to path atomically.
func Write(path string, c Checkpoint) error {
	if len(c.Job) > math.MaxUint16 {
		return fmt.Errorf("checkpoint: job name too long")
	}
	b := make([]byte, 0, len(magic)+2+len(c.Job)+16+8*len(c.Params)+4)
	b = append(b, magic...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(c.Job)))
	b = append(b, c.Job...)
	b = binary.BigEndian.AppendUint64(b, uint64(c.Step))
	b = binary.BigEndian.AppendUint32(b, c.ModelID)
	b = binary.BigEndian.AppendUint32(b, uint32(len(c.Params)))
	for _, v := range c.Params {
		b = binary.BigEndian.AppendUint64(b, math.Float64bits(v))
	}
	b = binary.BigEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))

	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, ".checkpoint-*")
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	defer os.Remove(tmp.Name()) // a no-op once renamed
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return fmt.Errorf("checkpoint: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("checkpoint: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync() // make the rename durable where the OS allows
		d.Close()
	}
	return nil
}

// maxParams caps the parameters a checkpoint may declare (2^28
// float64s = 2 GiB), so a corrupt header cannot make a reader allocate more.
const maxParams = 1 << 28

// Read reads and verifies the checkpoint in path.
func Read(path string) (Checkpoint, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Checkpoint{}, fmt.Errorf("checkpoint: %w", err)
	}
	return Parse(b)
}

// Parse decodes and verifies checkpoint bytes.
func Parse(b []byte) (Checkpoint, error) {
	bad := func(format string, a ...any) (Checkpoint, error) {
		return Checkpoint{}, fmt.Errorf("%w: %s", ErrCorrupt, fmt.Sprintf(format, a...))
	}
	if len(b) < len(magic)+2+16+4 || (string(b[:len(magic)]) != magic && string(b[:len(magic)]) != magic32) {
		return bad("not a pspnode checkpoint (wrong magic or too short)")
	}
	width := 8
	if string(b[:len(magic)]) == magic32 {
		width = 4
	}
	body, sum := b[:len(b)-4], binary.BigEndian.Uint32(b[len(b)-4:])
	if crc32.Checksum(body, castagnoli) != sum {
		return bad("checksum mismatch: the file is truncated or corrupt")
	}
	p := body[len(magic):]
	jl := int(binary.BigEndian.Uint16(p))
	p = p[2:]
	if len(p) < jl+16 {
		return bad("truncated header")
	}
	c := Checkpoint{Job: string(p[:jl])}
	p = p[jl:]
	c.Step = psp.Step(binary.BigEndian.Uint64(p))
	c.ModelID = binary.BigEndian.Uint32(p[8:])
	n := binary.BigEndian.Uint32(p[12:])
	p = p[16:]
	if c.Step < 0 {
		return bad("negative step %d", c.Step)
	}
	if n > maxParams || len(p) != width*int(n) {
		return bad("%d parameters declared, %d bytes present", n, len(p))
	}
	c.Params = make([]float64, n)
	for i := range c.Params {
		var v float64
		if width == 4 {
			v = float64(math.Float32frombits(binary.LittleEndian.Uint32(p[4*i:])))
		} else {
			v = math.Float64frombits(binary.BigEndian.Uint64(p[8*i:]))
		}
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return bad("parameter %d is %v", i, v)
		}
		c.Params[i] = v
	}
	return c, nil
}
