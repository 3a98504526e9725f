package figure

import (
	"image/png"
	"os"
	"path/filepath"
	"testing"
)

// TestGrid: three panels in rows of two make a PNG two panels wide and two
// high (the last row padded), at vgimg's 96 dots per inch.
func TestGrid(t *testing.T) {
	path := filepath.Join(t.TempDir(), "grid.png")
	line := Series{Name: "a", X: []float64{0, 1, 2}, Y: []float64{0.1, 0.5, 0.9}}
	var panels []Panel
	for _, title := range []string{"one", "two", "three"} {
		panels = append(panels, Panel{Options: Options{Title: title, XLabel: "s", YLabel: "accuracy"}, Series: []Series{line}})
	}
	if err := Grid(path, 2, panels...); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cfg, err := png.DecodeConfig(f)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Width != 2*5*96 || cfg.Height != 2*35*96/10 {
		t.Errorf("grid of 2×2 panels is %d×%d pixels, want %d×%d", cfg.Width, cfg.Height, 2*5*96, 2*35*96/10)
	}
	if err := Grid(path, 0, panels...); err == nil {
		t.Error("Grid with 0 columns: no error")
	}
}
