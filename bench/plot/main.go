// Command plot draws forkbench's results: for a result file X.json it writes
// X-restore.svg (every restore → first output sample, per scenario and
// runtime, as box plots over the raw samples) and X-pss.svg (total Pss of
// all clones, per scenario and runtime), and X-dedup.svg (the dedup
// scenario's group memory over time, a line per condition) if the file has
// those results, and X-flatten.svg (the flatten scenario's memory over the
// number of clones) if it has those, next to it (-format png for PNG).
//
//	go run ./bench/plot bench/results-2026-12-01.json
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"image/color"
	"os"
	"sort"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// result is the part of forkbench's Result that the plots use.
type result struct {
	Scenario       string    `json:"scenario"`
	Runtime        string    `json:"runtime"`
	RestoreMs      []float64 `json:"restore_ms"`
	FirstRestoreMs []float64 `json:"first_restore_ms"`
	TotalPssMiB    float64   `json:"total_pss_mib"`
}

var format = flag.String("format", "svg", "image format: svg or png")

func main() {
	flag.Parse()
	if flag.NArg() != 1 || (*format != "svg" && *format != "png") {
		fmt.Fprintln(os.Stderr, "usage: plot [-format svg|png] RESULTS.json")
		os.Exit(2)
	}
	if err := run(flag.Arg(0)); err != nil {
		fmt.Fprintf(os.Stderr, "plot: %v\n", err)
		os.Exit(1)
	}
}

func run(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var file struct {
		Results []result        `json:"results"`
		Dedup   []dedupResult   `json:"dedup"`
		Flatten []flattenResult `json:"flatten"`
	}
	if err := json.Unmarshal(data, &file); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	var clones []result
	for _, r := range file.Results {
		if len(r.RestoreMs)+len(r.FirstRestoreMs) > 0 && r.TotalPssMiB > 0 {
			clones = append(clones, r)
		}
	}
	if len(clones) == 0 && len(file.Dedup) == 0 && len(file.Flatten) == 0 {
		return fmt.Errorf("%s holds no clone scenario, dedup or flatten results", path)
	}
	stem := strings.TrimSuffix(path, ".json")
	var wrote []string
	if len(clones) > 0 {
		scenarios, runtimes := axes(clones)
		restoreOut, pssOut := stem+"-restore."+*format, stem+"-pss."+*format
		if err := restorePlot(clones, scenarios, runtimes, restoreOut); err != nil {
			return err
		}
		if err := pssPlot(clones, scenarios, runtimes, pssOut); err != nil {
			return err
		}
		wrote = append(wrote, restoreOut, pssOut)
	}
	if len(file.Dedup) > 0 {
		out := stem + "-dedup." + *format
		if err := dedupPlot(file.Dedup, out); err != nil {
			return err
		}
		wrote = append(wrote, out)
	}
	if len(file.Flatten) > 0 {
		out := stem + "-flatten." + *format
		if err := flattenPlot(file.Flatten, out); err != nil {
			return err
		}
		wrote = append(wrote, out)
	}
	fmt.Printf("wrote %s\n", strings.Join(wrote, ", "))
	return nil
}

// dedupResult is the part of forkbench's DedupResult that the plot uses.
type dedupResult struct {
	Condition  string    `json:"condition"`
	TimesS     []float64 `json:"times_s"`
	PssMiB     []float64 `json:"pss_mib"`
	ChargedMiB []float64 `json:"charged_mib"`
}

// dedupPlot draws each dedup condition's total Pss over time, one solid
// line each, and what its cgroup was charged, dashed (results that have it).
func dedupPlot(rs []dedupResult, out string) error {
	var names []string
	for _, r := range rs {
		names = append(names, r.Condition)
	}
	p, _ := newPlot("group memory over time, same payload in every instance (MiB; solid: total Pss, dashed: cgroup-charged)", "MiB", names)
	p.X.Label.Text = "seconds since the group was ready"
	for j, r := range rs {
		for _, s := range []struct {
			y      []float64
			dashed bool
		}{{r.PssMiB, false}, {r.ChargedMiB, true}} {
			if len(s.y) != len(r.TimesS) {
				continue // no such samples in this file
			}
			pts := make(plotter.XYs, len(r.TimesS))
			for i := range r.TimesS {
				pts[i].X, pts[i].Y = r.TimesS[i], s.y[i]
			}
			line, err := plotter.NewLine(pts)
			if err != nil {
				return fmt.Errorf("%s: %w", r.Condition, err)
			}
			line.Color = plotutil.Color(j)
			line.Width = vg.Points(1.5)
			if s.dashed {
				line.Dashes = []vg.Length{vg.Points(6), vg.Points(3)}
			}
			p.Add(line)
		}
	}
	return p.Save(8*vg.Inch, 4*vg.Inch, out)
}

// flattenResult is the part of forkbench's FlattenResult that the plot uses.
type flattenResult struct {
	N               int     `json:"n"`
	BaseMiB         float64 `json:"base_mib"`
	DeltaMiB        float64 `json:"delta_mib"`
	RssMiB          float64 `json:"rss_mib"`
	PssMiB          float64 `json:"pss_mib"`
	PrivateDirtyMiB float64 `json:"private_dirty_mib"`
	Error           string  `json:"error"`
}

// flattenPlot draws the clones' memory over their number: Rss (what they
// would cost without sharing), Pss and Private_Dirty as measured, and the
// ideal: the base's unchanged pages once plus N deltas. Rows of a failed
// run are left out.
func flattenPlot(all []flattenResult, out string) error {
	var rs []flattenResult
	for _, r := range all {
		if r.Error == "" {
			rs = append(rs, r)
		}
	}
	series := []struct {
		name string
		y    func(r flattenResult) float64
	}{
		{"Rss (no sharing)", func(r flattenResult) float64 { return r.RssMiB }},
		{"Pss", func(r flattenResult) float64 { return r.PssMiB }},
		{"Private_Dirty", func(r flattenResult) float64 { return r.PrivateDirtyMiB }},
		{"(base - delta) + N x delta", func(r flattenResult) float64 { return r.BaseMiB - r.DeltaMiB + float64(r.N)*r.DeltaMiB }},
	}
	var names []string
	for _, s := range series {
		names = append(names, s.name)
	}
	p, _ := newPlot("N clones over one base: memory (MiB)", "MiB", names)
	p.Legend.Left = true
	p.X.Label.Text = "clones (N, log scale)"
	p.X.Scale = plot.LogScale{}
	var ticks []plot.Tick
	for _, r := range rs {
		ticks = append(ticks, plot.Tick{Value: float64(r.N), Label: fmt.Sprint(r.N)})
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	for j, s := range series {
		pts := make(plotter.XYs, len(rs))
		for i, r := range rs {
			pts[i].X, pts[i].Y = float64(r.N), s.y(r)
		}
		line, points, err := plotter.NewLinePoints(pts)
		if err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		line.Color, points.Color = plotutil.Color(j), plotutil.Color(j)
		line.Width = vg.Points(1.5)
		p.Add(line, points)
	}
	return p.Save(8*vg.Inch, 4*vg.Inch, out)
}

// axes returns the scenarios in file order and the runtimes sorted.
func axes(rs []result) (scenarios, runtimes []string) {
	seenS, seenR := map[string]bool{}, map[string]bool{}
	for _, r := range rs {
		if !seenS[r.Scenario] {
			seenS[r.Scenario] = true
			scenarios = append(scenarios, r.Scenario)
		}
		if !seenR[r.Runtime] {
			seenR[r.Runtime] = true
			runtimes = append(runtimes, r.Runtime)
		}
	}
	sort.Strings(runtimes)
	return scenarios, runtimes
}

func find(rs []result, scenario, runtime string) (result, bool) {
	for _, r := range rs {
		if r.Scenario == scenario && r.Runtime == runtime {
			return r, true
		}
	}
	return result{}, false
}

// newPlot returns a plot with a title, a y label starting at 0, a legend
// entry per runtime in its color, and the width of one box or bar.
func newPlot(title, yLabel string, runtimes []string) (*plot.Plot, vg.Length) {
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = yLabel
	p.Y.Min = 0
	p.Legend.Top = true
	for j, rt := range runtimes {
		p.Legend.Add(rt, swatch{plotutil.Color(j)})
	}
	return p, vg.Points(14)
}

// save writes p, sized for n scenarios, to out.
func save(p *plot.Plot, n int, out string) error {
	return p.Save(vg.Length(120*n+200), 4*vg.Inch, out)
}

func restorePlot(rs []result, scenarios, runtimes []string, out string) error {
	p, w := newPlot("restore → first output (every clone after the first; ms)", "ms", runtimes)
	for j, rt := range runtimes {
		for i, sc := range scenarios {
			r, ok := find(rs, sc, rt)
			if !ok || len(r.RestoreMs) == 0 {
				continue
			}
			box, err := plotter.NewBoxPlot(w, float64(i)+slot(j, len(runtimes))*0.8/float64(len(runtimes)), plotter.Values(r.RestoreMs))
			if err != nil {
				return err
			}
			box.FillColor = plotutil.Color(j)
			p.Add(box)
		}
	}
	p.NominalX(scenarios...)
	return save(p, len(scenarios), out)
}

func pssPlot(rs []result, scenarios, runtimes []string, out string) error {
	p, w := newPlot("total Pss of all clones (MiB)", "MiB", runtimes)
	for j, rt := range runtimes {
		vals := make(plotter.Values, len(scenarios))
		for i, sc := range scenarios {
			if r, ok := find(rs, sc, rt); ok {
				vals[i] = r.TotalPssMiB
			}
		}
		bars, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return err
		}
		bars.Color = plotutil.Color(j)
		bars.Offset = w * vg.Length(slot(j, len(runtimes)))
		p.Add(bars)
	}
	p.NominalX(scenarios...)
	return save(p, len(scenarios), out)
}

// slot is the position of runtime j of n within a scenario's group, in
// units of one box or bar, centred on the scenario's label.
func slot(j, n int) float64 {
	return float64(j) - float64(n-1)/2
}

// swatch is a legend entry: a filled square of one color.
type swatch struct{ color color.Color }

// Thumbnail implements plot.Thumbnailer.
func (s swatch) Thumbnail(c *draw.Canvas) {
	c.FillPolygon(s.color, []vg.Point{{X: c.Min.X, Y: c.Min.Y}, {X: c.Min.X, Y: c.Max.Y}, {X: c.Max.X, Y: c.Max.Y}, {X: c.Max.X, Y: c.Min.Y}})
}
