package figure

import (
	"encoding/csv"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// palette has ten colours that stay apart in print (Tableau 10).
var palette = []color.Color{
	color.RGBA{31, 119, 180, 255}, color.RGBA{255, 127, 14, 255}, color.RGBA{44, 160, 44, 255},
	color.RGBA{214, 39, 40, 255}, color.RGBA{148, 103, 189, 255}, color.RGBA{140, 86, 75, 255},
	color.RGBA{227, 119, 194, 255}, color.RGBA{127, 127, 127, 255}, color.RGBA{188, 189, 34, 255},
	color.RGBA{23, 190, 207, 255},
}

// Series is one named line.
type Series struct {
	Name string
	X, Y []float64
}

// Options for a line figure.
type Options struct {
	Title, XLabel, YLabel string
	LogY                  bool
	LegendLeft            bool // put the legend top left instead of top right
	LegendBottom          bool // put the legend at the bottom
	Points                bool // draw points on the lines too
}

// Lines saves a PNG with one line per series.
func Lines(path string, o Options, series ...Series) error {
	p, err := linePlot(o, series)
	if err != nil {
		return fmt.Errorf("figure %s: %w", path, err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("figure %s: %w", path, err)
	}
	if err := p.Save(8*vg.Inch, 5*vg.Inch, path); err != nil {
		return fmt.Errorf("figure %s: %w", path, err)
	}
	return nil
}

// linePlot is the plot of Lines: one line per series.
func linePlot(o Options, series []Series) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text, p.X.Label.Text, p.Y.Label.Text = o.Title, o.XLabel, o.YLabel
	p.Legend.Top = !o.LegendBottom
	p.Legend.Left = o.LegendLeft
	p.Add(plotter.NewGrid())
	if o.LogY {
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	}
	for i, s := range series {
		xys := make(plotter.XYs, 0, len(s.X))
		for j := range s.X {
			if j < len(s.Y) && !math.IsNaN(s.Y[j]) && !math.IsInf(s.Y[j], 0) && (!o.LogY || s.Y[j] > 0) {
				xys = append(xys, plotter.XY{X: s.X[j], Y: s.Y[j]})
			}
		}
		if len(xys) == 0 {
			continue
		}
		l, err := plotter.NewLine(xys)
		if err != nil {
			return nil, fmt.Errorf("series %s: %w", s.Name, err)
		}
		l.Color = palette[i%len(palette)]
		l.Dashes = plotutil.Dashes(i / len(palette))
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(s.Name, l)
		if o.Points {
			sc, err := plotter.NewScatter(xys)
			if err == nil {
				sc.Color = palette[i%len(palette)]
				sc.Shape = plotutil.Shape(i)
				p.Add(sc)
			}
		}
	}
	return p, nil
}

// Distribution turns samples into the points of a histogram outline with
// unit-wide integer bins (x = value, y = share of samples), for the "progress
// distribution in steps" figures. Samples spread over more than
// maxDistBins values share wider bins (x is a bin's lowest value), so that
// one far value (a node that took a liar's step) cannot make the figure
// allocate without bound.
func Distribution(name string, values []float64) Series {
	if len(values) == 0 {
		return Series{Name: name}
	}
	lo, hi := slices.Min(values), slices.Max(values)
	width := max(1, math.Ceil((hi-lo+1)/maxDistBins))
	counts := make([]float64, int((hi-lo)/width)+1)
	for _, v := range values {
		counts[int((v-lo)/width)]++
	}
	s := Series{Name: name}
	s.X = append(s.X, lo-width)
	s.Y = append(s.Y, 0)
	for i, c := range counts {
		if width > 1 && c == 0 && i > 0 && i < len(counts)-1 && counts[i-1] == 0 && counts[i+1] == 0 {
			continue // a run of empty wide bins: its ends draw it
		}
		s.X = append(s.X, lo+float64(i)*width)
		s.Y = append(s.Y, c/float64(len(values)))
	}
	s.X = append(s.X, hi+width)
	s.Y = append(s.Y, 0)
	return s
}

// maxDistBins bounds a Distribution's bins.
const maxDistBins = 4096

// CSV writes rows to path, creating its directory.
func CSV(path string, header []string, rows [][]string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("csv %s: %w", path, err)
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("csv %s: %w", path, err)
	}
	w := csv.NewWriter(f)
	_ = w.Write(header)
	_ = w.WriteAll(rows) // flushes
	if err := w.Error(); err != nil {
		f.Close()
		return fmt.Errorf("csv %s: %w", path, err)
	}
	return f.Close()
}
