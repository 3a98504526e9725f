package figure

import (
	"fmt"
	"os"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Panel is one plot of a Grid: its options and lines, as for Lines.
type Panel struct {
	Options
	Series []Series
}

// Grid saves a PNG of panels, cols to a row (a short last row is padded
// with empty panels), each 5 × 3.5 inches, their axes aligned.
func Grid(path string, cols int, panels ...Panel) error {
	if cols < 1 || len(panels) == 0 {
		return fmt.Errorf("figure %s: %d panels in rows of %d", path, len(panels), cols)
	}
	rows := (len(panels) + cols - 1) / cols
	plots := make([][]*plot.Plot, rows)
	for r := range plots {
		plots[r] = make([]*plot.Plot, cols)
		for c := range plots[r] {
			k := r*cols + c
			if k >= len(panels) {
				plots[r][c] = plot.New()
				plots[r][c].HideAxes()
				continue
			}
			p, err := linePlot(panels[k].Options, panels[k].Series)
			if err != nil {
				return fmt.Errorf("figure %s: %w", path, err)
			}
			plots[r][c] = p
		}
	}
	img := vgimg.New(vg.Length(cols)*5*vg.Inch, vg.Length(rows)*3.5*vg.Inch)
	dc := draw.New(img)
	t := draw.Tiles{Rows: rows, Cols: cols, PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 4,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	canvases := plot.Align(plots, t, dc)
	for r := range plots {
		for c := range plots[r] {
			plots[r][c].Draw(canvases[r][c])
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("figure %s: %w", path, err)
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("figure %s: %w", path, err)
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("figure %s: %w", path, err)
	}
	return f.Close()
}
