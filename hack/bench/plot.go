package main

import (
	"cmp"
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"

	"github.com/scopeplane/scopeplane/xds/model"
)

// axis is what a chart's x axis varies: the Services of the world at a
// fixed number of proxies, or the proxies at a fixed world.
type axis struct {
	file, label string
	x           func(Cell) int
	fixed       func(Cell) int
	fixedName   string
}

var plotAxes = []axis{
	{file: "vs-services.svg", label: "Services in the world (every proxy gets all)", x: func(c Cell) int { return c.S }, fixed: func(c Cell) int { return c.N }, fixedName: "N"},
	{file: "vs-proxies.svg", label: "proxies", x: func(c Cell) int { return c.N }, fixed: func(c Cell) int { return c.S }, fixedName: "S"},
}

// metric is one panel: a figure of a cell, positive or left out.
type metric struct {
	title string
	value func(*Result) float64
}

// endpointPhase is the mean of a cell's endpoint events.
func endpointPhase(r *Result) *Phase {
	for _, p := range r.merged() {
		if p.Name == EvEndpoint || strings.HasPrefix(p.Name, EvEndpoint+" (") {
			return p
		}
	}
	return nil
}

var plotMetrics = []metric{
	{"one endpoint change: bytes sent per proxy", func(r *Result) float64 {
		if p := endpointPhase(r); p != nil {
			return float64(p.Bytes) / float64(r.N)
		}
		return 0
	}},
	{"one endpoint change: control-plane CPU (ms)", func(r *Result) float64 {
		if p := endpointPhase(r); p != nil {
			return p.CPU.Seconds() * 1000
		}
		return 0
	}},
	{"one endpoint change: convergence p99 (ms)", func(r *Result) float64 {
		if p := endpointPhase(r); p != nil {
			return p.Percentile(0.99).Seconds() * 1000
		}
		return 0
	}},
	{"control-plane memory per proxy after sync (KB)", func(r *Result) float64 { return r.RSSPerProxy() / 1000 }},
}

// series is one line: an implementation in one protocol.
type series struct {
	impl  string
	proto model.Protocol
}

var plotSeries = []series{{"scopeplane", model.SotW}, {"scopeplane", model.Delta}, {"baseline", model.SotW}, {"baseline", model.Delta}}

var seriesColors = map[series]color.Color{
	{"scopeplane", model.SotW}:  color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	{"scopeplane", model.Delta}: color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	{"baseline", model.SotW}:    color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	{"baseline", model.Delta}:   color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
}

// Plot writes, into dir, one SVG per axis along which the unscoped cells
// vary (vs-services.svg at the most common N, vs-proxies.svg at the most
// common S), each a 2×2 grid of bytes, CPU, p99 and memory for scopeplane
// and the baseline in both protocols, on log-log scales: the shape of the
// cost, before the tables' numbers. An axis with fewer than two points is
// not drawn. It returns the files written.
func Plot(dir string, results []*Result) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var written []string
	for _, a := range plotAxes {
		cells, fixed := alongAxis(results, a)
		if cells == nil {
			continue
		}
		path := filepath.Join(dir, a.file)
		if err := plotGrid(path, a, fixed, cells); err != nil {
			return written, fmt.Errorf("%s: %w", path, err)
		}
		written = append(written, path)
	}
	return written, nil
}

// alongAxis picks the correct unscoped cells whose fixed dimension has the
// most distinct x values, and that value; nil when no line has two points.
func alongAxis(results []*Result, a axis) ([]*Result, int) {
	xs := map[int]map[int]bool{}
	for _, r := range results {
		if r.Layout != Unscoped || r.Err != "" || r.Churn.On() {
			continue
		}
		if xs[a.fixed(r.Cell)] == nil {
			xs[a.fixed(r.Cell)] = map[int]bool{}
		}
		xs[a.fixed(r.Cell)][a.x(r.Cell)] = true
	}
	best, most := 0, 0
	for f, set := range xs {
		if len(set) > most || (len(set) == most && f < best) { // ties: the smaller
			best, most = f, len(set)
		}
	}
	if most < 2 {
		return nil, 0
	}
	var out []*Result
	for _, r := range results {
		if r.Layout == Unscoped && r.Err == "" && !r.Churn.On() && a.fixed(r.Cell) == best {
			out = append(out, r)
		}
	}
	return out, best
}

func plotGrid(path string, a axis, fixed int, cells []*Result) error {
	const rows, cols = 2, 2
	plots := make([][]*plot.Plot, rows)
	for i, m := range plotMetrics {
		if plots[i/cols] == nil {
			plots[i/cols] = make([]*plot.Plot, cols)
		}
		p, err := panel(m, a, fixed, cells)
		if err != nil {
			return err
		}
		plots[i/cols][i%cols] = p
	}
	c := vgsvg.New(12*vg.Inch, 8*vg.Inch)
	dc := draw.New(c)
	tiles := draw.Tiles{Rows: rows, Cols: cols, PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 4,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	canvases := plot.Align(plots, tiles, dc)
	for j := range rows {
		for i := range cols {
			plots[j][i].Draw(canvases[j][i])
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := c.WriteTo(f); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// panel is one metric's chart: a line per series through its cells,
// ordered along the axis; a figure of zero (nothing measured, or nothing
// sent) has no place on a log scale and is left out.
func panel(m metric, a axis, fixed int, cells []*Result) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("%s, %s=%d", m.title, a.fixedName, fixed)
	p.X.Label.Text = a.label
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.X.Tick.Marker, p.Y.Tick.Marker = plot.LogTicks{Prec: -1}, plot.LogTicks{Prec: -1}
	p.Legend.Top, p.Legend.Left = true, true
	p.Add(plotter.NewGrid())
	var ys []float64
	for _, s := range plotSeries {
		var pts plotter.XYs
		for _, r := range cells {
			if r.Impl != s.impl || r.Protocol != s.proto {
				continue
			}
			if v := m.value(r); v > 0 {
				pts = append(pts, plotter.XY{X: float64(a.x(r.Cell)), Y: v})
			}
		}
		if len(pts) == 0 {
			continue
		}
		for _, pt := range pts {
			ys = append(ys, pt.Y)
		}
		slices.SortFunc(pts, func(a, b plotter.XY) int { return cmp.Compare(a.X, b.X) })
		line, points, err := plotter.NewLinePoints(pts)
		if err != nil {
			return nil, err
		}
		line.Color, points.Color = seriesColors[s], seriesColors[s]
		if s.impl == "baseline" {
			line.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		}
		p.Add(line, points)
		p.Legend.Add(fmt.Sprintf("%s %s", s.impl, s.proto), line, points)
	}
	// gonum widens an axis whose data has one value by ±1, which can reach
	// 0 on a log scale: widen it by a factor instead.
	switch {
	case len(ys) == 0: // nothing measured: an empty panel that says so
		p.Title.Text += " (no data)"
		p.X.Min, p.X.Max, p.Y.Min, p.Y.Max = 1, 10, 1, 10
	case slices.Min(ys) == slices.Max(ys):
		p.Y.Min, p.Y.Max = ys[0]/2, ys[0]*2
	}
	// Headroom above the highest line for the legend, which is drawn in
	// the top left corner.
	if len(ys) > 0 {
		p.Y.Max = max(p.Y.Max, slices.Max(ys)) * 30
	}
	return p, nil
}
