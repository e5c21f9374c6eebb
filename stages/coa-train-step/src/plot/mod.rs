//! Figures as PNG: training curves (loss, reward, ... against the step) and grouped bar panels
//! (the pipeline's teacher vs SFT vs SFT+RL comparison per suite), plus a small text table.
//!
//! plotters draws with its bitmap backend; text goes through ab_glyph (pure Rust, no system font
//! libraries) in DejaVu Sans, which the `dejavu` crate embeds in the binary (DejaVu fonts
//! license: the Bitstream Vera terms, free to embed and redistribute). So a figure looks the same
//! on a bare machine as on a desktop.
//!
//! [`command`] is the `coa-train-step plot` subcommand that draws them from files.

pub mod command;

use std::path::Path;
use std::sync::Once;

use anyhow::{anyhow, bail, Context, Result};
use coa_schemas::output::TempFile;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::FontStyle;

/// The family every figure's text is set in (registered from the embedded DejaVu Sans).
const FONT: &str = "sans-serif";
const CURVE_SIZE: (u32, u32) = (1200, 720);
/// Width of one bar panel; a figure is as wide as its panels.
const PANEL_WIDTH: u32 = 800;
const BARS_HEIGHT: u32 = 760;

const BLACK: RGBColor = RGBColor(0, 0, 0);
const GRID: RGBColor = RGBColor(225, 225, 225);
const CURVE: RGBColor = RGBColor(31, 119, 180);
/// The vertical marks on a curve (epoch ends).
const MARK: RGBColor = RGBColor(214, 39, 40);
/// One colour per series, in order (grey for the teacher, then the tab10 blue, orange, green, red).
const SERIES: [RGBColor; 5] = [RGBColor(127, 127, 127), RGBColor(31, 119, 180), RGBColor(255, 127, 14), RGBColor(44, 160, 44), RGBColor(214, 39, 40)];

/// Registers the embedded fonts with plotters once per process.
fn register_fonts() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // Both are valid TrueType files compiled into the binary; a failure here is a build defect.
        let _ = plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular());
        let _ = plotters::style::register_font(FONT, FontStyle::Bold, dejavu::sans::bold());
    });
}

fn font(size: f64) -> TextStyle<'static> {
    (FONT, size).into_font().color(&BLACK)
}

fn bold(size: f64) -> TextStyle<'static> {
    (FONT, size, FontStyle::Bold).into_font().color(&BLACK)
}

fn draw_err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("drawing the plot: {e:?}")
}

/// Up to ~`n` "nice" tick values (1, 2 or 5 times a power of ten apart) covering [lo, hi].
pub fn nice_ticks(lo: f64, hi: f64, n: usize) -> Vec<f64> {
    if !(hi > lo) || !lo.is_finite() || !hi.is_finite() {
        return vec![lo];
    }
    let raw = (hi - lo) / n.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * mag).find(|s| *s >= raw).unwrap_or(10.0 * mag);
    let first = (lo / step).ceil() * step;
    let mut ticks = Vec::new();
    let mut t = first;
    while t <= hi + step * 1e-9 {
        ticks.push(if t.abs() < step * 1e-9 { 0.0 } else { t });
        t += step;
    }
    ticks
}

/// A number as a person writes it on an axis or above a bar: thousands separated from 1,000 on,
/// otherwise at most three significant decimals, scientific only for the very small or large.
pub fn fmt_number(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let a = v.abs();
    if a >= 1e9 || a < 1e-3 {
        return format!("{v:.1e}");
    }
    if a >= 1000.0 {
        let out = coa_schemas::text::group_digits(a.round() as u64);
        return if v < 0.0 { format!("-{out}") } else { out };
    }
    let decimals = if a >= 100.0 { 0 } else if a >= 10.0 { 1 } else if a >= 1.0 { 2 } else { 3 };
    let s = format!("{v:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// Writes the loss curve (`points` = (step, loss)) to `path` as a PNG, atomically: a log axis
/// (a loss falls over decades, and a linear axis leaves most steps flat near 0), with the steps
/// where an epoch ends marked (`epoch_ends`) and the epoch's length in steps under the axis.
pub fn write_loss_png(path: &Path, points: &[(f64, f64)], title: &str, epoch_ends: &[u64], steps_per_epoch: u64) -> Result<()> {
    let marks = epoch_ends.iter().enumerate().map(|(k, &s)| (s as f64, format!("epoch {}", k + 1))).collect();
    let xlabel = if steps_per_epoch > 0 { format!("step (an epoch is {} steps)", fmt_number(steps_per_epoch as f64)) } else { "step".into() };
    let log_y = points.iter().all(|p| p.1 > 0.0 || !p.1.is_finite());
    write_curve_png(path, points, title, "loss", &CurveStyle { log_y, marks, xlabel })
}

/// How [`write_curve_png`] draws: the y axis in log scale, vertical lines at given steps with a
/// label (epoch ends), and the x axis's name.
#[derive(Debug, Clone, Default)]
pub struct CurveStyle {
    pub log_y: bool,
    pub marks: Vec<(f64, String)>,
    /// Default "step".
    pub xlabel: String,
}

fn check_png_path(path: &Path, what: &str) -> Result<()> {
    if path.extension().and_then(|e| e.to_str()).map(|e| e.eq_ignore_ascii_case("png")) != Some(true) {
        bail!("{what} {}: the plot is written as PNG, give a path ending in .png", path.display());
    }
    Ok(())
}

/// Renders into a temporary `.png` beside `path` and renames it into place when drawing worked.
fn write_png_atomically(path: &Path, size: (u32, u32), draw: impl FnOnce(&DrawingArea<BitMapBackend, Shift>) -> Result<()>) -> Result<()> {
    register_fonts();
    // The temporary name keeps `.png`: the bitmap backend picks the format from it.
    let (pending, _file) = TempFile::create_keeping_extension(path)?;
    let tmp = pending.tmp_path().to_path_buf();
    let drawn = (|| -> Result<()> {
        let root = BitMapBackend::new(&tmp, size).into_drawing_area();
        root.fill(&WHITE).map_err(draw_err)?;
        draw(&root)?;
        root.present().map_err(draw_err)
    })();
    drawn.with_context(|| format!("writing {}", path.display()))?;
    pending.commit()
}

/// Writes a curve (`points` = (step, value)) to `path` as a PNG, atomically: the title above,
/// the x axis in whole steps, `ylabel` along the y axis (in log scale with `style.log_y`, which
/// needs positive values), a light grid, and `style.marks` as labelled vertical lines.
pub fn write_curve_png(path: &Path, points: &[(f64, f64)], title: &str, ylabel: &str, style: &CurveStyle) -> Result<()> {
    let finite: Vec<(f64, f64)> = points.iter().copied().filter(|(x, y)| x.is_finite() && y.is_finite()).collect();
    if finite.is_empty() {
        bail!("--plot {}: no finite {ylabel} values to plot", path.display());
    }
    check_png_path(path, "--plot")?;
    write_png_atomically(path, CURVE_SIZE, |root| draw_curve(root, &finite, title, ylabel, style))
}

/// Draws [`write_curve_png`]'s figure on `root` (of `CURVE_SIZE`) from its finite points.
pub fn draw_curve<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, finite: &[(f64, f64)], title: &str, ylabel: &str, style: &CurveStyle) -> Result<()> {
    register_fonts();
    let log_y = style.log_y && finite.iter().all(|p| p.1 > 0.0);
    // Steps are whole numbers: an integer x axis puts its ticks on them (never at step 1.2).
    let pts: Vec<(i64, f64)> = finite.iter().map(|&(x, y)| (x.round() as i64, y)).collect();
    let (mut x0, mut x1) = pts.iter().fold((i64::MAX, i64::MIN), |(a, b), p| (a.min(p.0), b.max(p.0)));
    if x1 <= x0 {
        x0 -= 1;
        x1 += 1;
    }
    let (mut y0, mut y1) = pts.iter().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.1), b.max(p.1)));
    if log_y {
        // A little room in log terms, and at least a factor of 10 shown.
        (y0, y1) = (y0 / 1.25, y1 * 1.25);
        if y1 / y0 < 10.0 {
            let mid = (y0 * y1).sqrt();
            (y0, y1) = (mid / 10f64.sqrt(), mid * 10f64.sqrt());
        }
    } else {
        if y1 <= y0 {
            y0 -= 0.5;
            y1 += 0.5;
        }
        let pad = (y1 - y0) * 0.05;
        y0 = if pts.iter().all(|p| p.1 >= 0.0) { (y0 - pad).max(0.0) } else { y0 - pad };
        y1 += pad;
    }
    let xlabel = if style.xlabel.is_empty() { "step" } else { style.xlabel.as_str() };
    let marks: Vec<&(f64, String)> = style.marks.iter().filter(|(x, _)| *x >= x0 as f64 && *x <= x1 as f64).collect();
    {
        // The same chart over a linear or a log y axis (two coordinate types).
        macro_rules! draw {
            ($y:expr) => {{
                let mut chart = ChartBuilder::on(root)
                    .caption(title, bold(30.0))
                    .margin(24)
                    .x_label_area_size(64)
                    .y_label_area_size(96)
                    .build_cartesian_2d(x0..x1, $y)
                    .map_err(draw_err)?;
                chart
                    .configure_mesh()
                    .light_line_style(WHITE)
                    .bold_line_style(GRID)
                    .x_labels(10)
                    .y_labels(8)
                    .x_label_formatter(&|v| fmt_number(*v as f64))
                    .y_label_formatter(&|v| fmt_number(*v))
                    .x_desc(xlabel)
                    .y_desc(ylabel)
                    .label_style(font(20.0))
                    .axis_desc_style(font(24.0))
                    .draw()
                    .map_err(draw_err)?;
                for (x, label) in &marks {
                    let x = x.round() as i64;
                    chart.draw_series(LineSeries::new([(x, y0), (x, y1)], MARK.stroke_width(2))).map_err(draw_err)?;
                    let (px, py) = chart.backend_coord(&(x, y1));
                    root.draw(&Text::new(label.clone(), (px - 6, py + 6), font(18.0).pos(Pos::new(HPos::Right, VPos::Top)))).map_err(draw_err)?;
                }
                chart.draw_series(LineSeries::new(pts.iter().copied(), CURVE.stroke_width(3))).map_err(draw_err)?;
            }};
        }
        if log_y {
            draw!((y0..y1).log_scale());
        } else {
            draw!(y0..y1);
        }
        Ok(())
    }
}

/// The size of [`write_curve_png`]'s figure.
pub const fn curve_size() -> (u32, u32) {
    CURVE_SIZE
}

/// Writes `fig` as side-by-side panels of lines (RL curves per iteration): each panel's groups
/// are the x axis in order (iterations), each series a line with a dot per value (a null leaves
/// a gap), one legend for the figure where series are named.
pub fn write_lines_png(path: &Path, fig: &BarFigure) -> Result<()> {
    fig.check().with_context(|| format!("plotting {}", path.display()))?;
    check_png_path(path, "-o")?;
    write_png_atomically(path, bars_size(fig), |root| draw_lines(root, fig))
}

/// Draws [`write_lines_png`]'s figure on `root` (of [`bars_size`]).
pub fn draw_lines<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, fig: &BarFigure) -> Result<()> {
    register_fonts();
    let (w, _) = root.dim_in_pixel();
    root.draw(&Text::new(fig.title.clone(), (w as i32 / 2, 18), bold(30.0).pos(Pos::new(HPos::Center, VPos::Top)))).map_err(draw_err)?;
    let labels: Vec<&str> = fig.panels[0].series.iter().map(|s| s.label.as_str()).collect();
    let named = labels.iter().any(|l| !l.is_empty());
    let top = if named {
        draw_legend(root, &labels, w as i32 / 2, 64)?;
        104
    } else {
        64
    };
    let (_, body) = root.split_vertically(top);
    for (panel, area) in fig.panels.iter().zip(body.split_evenly((1, fig.panels.len()))) {
        draw_line_panel(root, &area, panel, named)?;
    }
    Ok(())
}

/// A panel's axes, shared by bar and line panels: its title, the y axis with its label, the x
/// axis spanning `x` with its label, and each group's name under the axis at `x_of(group)`.
fn panel_axes<'a, DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    area: &'a DrawingArea<DB, Shift>,
    panel: &BarPanel,
    x: std::ops::Range<f64>,
    (y0, y1): (f64, f64),
    x_of: impl Fn(usize) -> f64,
) -> Result<ChartContext<'a, DB, Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>>> {
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, bold(26.0))
        .margin_left(16)
        .margin_right(28)
        .margin_top(8)
        .margin_bottom(12)
        .x_label_area_size(if panel.xlabel.is_empty() { 48 } else { 76 })
        .y_label_area_size(96)
        .build_cartesian_2d(x, y0..y1)
        .map_err(draw_err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .light_line_style(WHITE)
        .bold_line_style(GRID)
        .x_labels(0)
        .y_labels(8)
        .y_label_formatter(&|v| fmt_number(*v))
        .x_desc(panel.xlabel.as_str())
        .y_desc(panel.ylabel.as_str())
        .label_style(font(20.0))
        .axis_desc_style(font(22.0))
        .draw()
        .map_err(draw_err)?;
    // Group names under the axis, centred on their group.
    for (g, name) in panel.groups.iter().enumerate() {
        let (px, py) = chart.backend_coord(&(x_of(g), y0));
        root.draw(&Text::new(name.clone(), (px, py + 10), font(22.0).pos(Pos::new(HPos::Center, VPos::Top)))).map_err(draw_err)?;
    }
    Ok(chart)
}

fn draw_line_panel<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, area: &DrawingArea<DB, Shift>, panel: &BarPanel, named: bool) -> Result<()> {
    let values: Vec<f64> = panel.series.iter().flat_map(|s| s.values.iter().flatten().copied()).collect();
    let (lo, hi) = values.iter().fold((f64::MAX, f64::MIN), |(a, b), &v| (a.min(v), b.max(v)));
    let (lo, hi) = if values.is_empty() { (0.0, 1.0) } else { (lo, hi) };
    let span = if hi > lo { hi - lo } else { hi.abs().max(1.0) };
    let y0 = if lo >= 0.0 && lo - 0.15 * span < 0.0 { 0.0 } else { lo - 0.15 * span };
    let y1 = hi + 0.15 * span;
    // Group k at x = k + 1, with half a step of room each side.
    let n = panel.groups.len();
    let mut chart = panel_axes(root, area, panel, 0.5..n as f64 + 0.5, (y0, y1), |g| g as f64 + 1.0)?;
    for (s, series) in panel.series.iter().enumerate() {
        let color = if named { SERIES[s % SERIES.len()] } else { CURVE };
        // Runs of consecutive values, each a line; every value a dot with its number.
        let mut run: Vec<(f64, f64)> = Vec::new();
        for (g, v) in series.values.iter().enumerate() {
            match v {
                Some(v) => run.push((g as f64 + 1.0, *v)),
                None => {
                    chart.draw_series(LineSeries::new(run.drain(..), color.stroke_width(3))).map_err(draw_err)?;
                }
            }
        }
        chart.draw_series(LineSeries::new(run, color.stroke_width(3))).map_err(draw_err)?;
        for (g, v) in series.values.iter().enumerate() {
            if let Some(v) = v {
                chart.draw_series(std::iter::once(Circle::new((g as f64 + 1.0, *v), 6, color.filled()))).map_err(draw_err)?;
                let (px, py) = chart.backend_coord(&(g as f64 + 1.0, *v));
                root.draw(&Text::new(format!("{}{}", fmt_number(*v), panel.unit), (px, py - 12), font(17.0).pos(Pos::new(HPos::Center, VPos::Bottom)))).map_err(draw_err)?;
            }
        }
    }
    Ok(())
}

/// One named series of a bar panel: a value per group; `None` (JSON null) is "no value", e.g.
/// tokens per solved task when nothing was solved.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BarSeries {
    pub label: String,
    pub values: Vec<Option<f64>>,
}

/// One panel of a bar figure: groups along the x axis (e.g. suites), and within each group one
/// bar per series (e.g. teacher, SFT, SFT+RL), coloured by series and named in the legend.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BarPanel {
    pub title: String,
    /// The y-axis label (what the bars measure, with its unit).
    #[serde(default)]
    pub ylabel: String,
    /// The x-axis label (what the groups are).
    #[serde(default)]
    pub xlabel: String,
    /// Appended to every value label ("%" for rates).
    #[serde(default)]
    pub unit: String,
    /// Written where a bar has no value (default "n/a").
    #[serde(default)]
    pub missing: Option<String>,
    pub groups: Vec<String>,
    pub series: Vec<BarSeries>,
}

/// A figure of side-by-side bar panels, as `coa-train-step plot --bars FILE.json` reads it.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BarFigure {
    pub title: String,
    pub panels: Vec<BarPanel>,
}

/// The shape `--bars` expects, for error messages.
pub const BARS_JSON_SHAPE: &str = "{\"title\": str, \"panels\": [{\"title\": str, \"ylabel\": str, \"xlabel\": str, \"unit\": str, \
\"missing\": str, \"groups\": [str, ...], \"series\": [{\"label\": str, \"values\": [number or null, one per group]}, ...]}, ...]}";

impl BarFigure {
    /// Reads and checks a `--bars` JSON file: every error names the file and what was expected.
    pub fn read(path: &Path) -> Result<BarFigure> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let fig: BarFigure = serde_json::from_str(&text).map_err(|e| anyhow!("{}: {e}; expected {BARS_JSON_SHAPE}", path.display()))?;
        fig.check().with_context(|| format!("{}", path.display()))?;
        Ok(fig)
    }

    /// Every panel has groups and series, one value per group in each series, and no value is
    /// infinite or NaN (JSON cannot carry those, but a figure built in code can).
    pub fn check(&self) -> Result<()> {
        if self.panels.is_empty() {
            bail!("no panels: nothing to plot");
        }
        for (k, p) in self.panels.iter().enumerate() {
            let name = format!("panel {} ({:?})", k + 1, p.title);
            if p.groups.is_empty() || p.series.is_empty() {
                bail!("{name}: needs at least one group and one series, has {} groups and {} series", p.groups.len(), p.series.len());
            }
            for s in &p.series {
                if s.values.len() != p.groups.len() {
                    bail!("{name}: series {:?} has {} values for {} groups {:?}", s.label, s.values.len(), p.groups.len(), p.groups);
                }
                if let Some(v) = s.values.iter().flatten().find(|v| !v.is_finite()) {
                    bail!("{name}: series {:?} has the value {v}; expected finite numbers or null", s.label);
                }
            }
        }
        Ok(())
    }
}

/// Where a bar was drawn, in pixels of the whole figure (for the tests, and nothing else).
#[derive(Debug, Clone, PartialEq)]
pub struct BarRect {
    pub panel: usize,
    pub group: usize,
    pub series: usize,
    /// Left, top, right, bottom.
    pub rect: (i32, i32, i32, i32),
    pub color: RGBColor,
}

/// Writes the bar figure to `path` as a PNG, atomically; returns where each bar went.
pub fn write_bars_png(path: &Path, fig: &BarFigure) -> Result<Vec<BarRect>> {
    fig.check().with_context(|| format!("plotting {}", path.display()))?;
    check_png_path(path, "-o")?;
    let mut rects = Vec::new();
    write_png_atomically(path, bars_size(fig), |root| {
        rects = draw_bars(root, fig)?;
        Ok(())
    })?;
    Ok(rects)
}

/// The figure's size in pixels: one panel width per panel.
pub fn bars_size(fig: &BarFigure) -> (u32, u32) {
    (PANEL_WIDTH * fig.panels.len().max(1) as u32, BARS_HEIGHT)
}

/// Draws the whole figure (title, shared legend, panels) on `root`; returns the bars' pixels.
pub fn draw_bars<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, fig: &BarFigure) -> Result<Vec<BarRect>> {
    register_fonts();
    let (w, _) = root.dim_in_pixel();
    root.draw(&Text::new(fig.title.clone(), (w as i32 / 2, 18), bold(30.0).pos(Pos::new(HPos::Center, VPos::Top)))).map_err(draw_err)?;
    // One legend for the figure when the series are the same in every panel (the usual case),
    // otherwise one per panel; a single unnamed series needs none.
    let labels: Vec<&str> = fig.panels[0].series.iter().map(|s| s.label.as_str()).collect();
    let shared = fig.panels.iter().all(|p| p.series.iter().map(|s| s.label.as_str()).eq(labels.iter().copied()));
    let legend = labels.len() > 1 || labels.first().is_some_and(|l| !l.is_empty());
    let top = if shared && legend {
        draw_legend(root, &labels, w as i32 / 2, 64)?;
        104
    } else {
        64
    };
    let (_, body) = root.split_vertically(top);
    let mut rects = Vec::new();
    for (k, (panel, area)) in fig.panels.iter().zip(body.split_evenly((1, fig.panels.len()))).enumerate() {
        rects.extend(draw_panel(root, &area, k, panel, !shared && legend)?);
    }
    Ok(rects)
}

/// A row of coloured squares with their labels, centred on `cx`.
fn draw_legend<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, labels: &[&str], cx: i32, y: i32) -> Result<()> {
    let style = font(22.0);
    let widths: Vec<i32> = labels.iter().map(|l| root.estimate_text_size(l, &style).map(|(w, _)| w as i32).unwrap_or(100)).collect();
    let total: i32 = widths.iter().map(|w| w + 22 + 40).sum::<i32>() - 40;
    let mut x = cx - total / 2;
    for (i, (label, lw)) in labels.iter().zip(&widths).enumerate() {
        root.draw(&Rectangle::new([(x, y), (x + 16, y + 16)], SERIES[i % SERIES.len()].filled())).map_err(draw_err)?;
        root.draw(&Text::new(label.to_string(), (x + 22, y + 8), style.pos(Pos::new(HPos::Left, VPos::Center)))).map_err(draw_err)?;
        x += lw + 22 + 40;
    }
    Ok(())
}

/// The y range of a bar panel: zero and every value, with room above (and below, for negative
/// values) for the value labels. A percentage axis reaches at least 10%, so bars of 0% and 1%
/// read as small, not as a 0-0.14 axis.
fn bar_range(values: impl Iterator<Item = f64>, unit: &str) -> (f64, f64) {
    let (lo, mut hi) = values.fold((0.0f64, 0.0f64), |(a, b), v| (a.min(v), b.max(v)));
    if unit == "%" {
        hi = hi.max(10.0);
    }
    let span = if hi > lo { hi - lo } else { 1.0 };
    (if lo < 0.0 { lo - 0.14 * span } else { 0.0 }, if hi > 0.0 || lo >= 0.0 { hi + 0.14 * span } else { 0.0 })
}

fn draw_panel<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, area: &DrawingArea<DB, Shift>, k: usize, panel: &BarPanel, own_legend: bool) -> Result<Vec<BarRect>> {
    let (y0, y1) = bar_range(panel.series.iter().flat_map(|s| s.values.iter().flatten().copied()), &panel.unit);
    let n_groups = panel.groups.len();
    let mut chart = panel_axes(root, area, panel, 0.0..n_groups as f64, (y0, y1), |g| g as f64 + 0.5)?;
    let n_series = panel.series.len() as f64;
    // Bars of a group share 80% of its width, none wider than 30% (a lone series stays a bar).
    let width = (0.8 / n_series).min(0.3);
    let group_pad = (1.0 - width * n_series) / 2.0;
    let single = panel.series.len() == 1 && panel.series[0].label.is_empty();
    let missing = panel.missing.as_deref().unwrap_or("n/a");
    let mut rects = Vec::new();
    for (s, series) in panel.series.iter().enumerate() {
        let color = if single { CURVE } else { SERIES[s % SERIES.len()] };
        for (g, v) in series.values.iter().enumerate() {
            let left = g as f64 + group_pad + s as f64 * width;
            let right = left + width * 0.92;
            let mid = (left + right) / 2.0;
            let label_style = font(17.0);
            match v {
                Some(v) => {
                    chart.draw_series(std::iter::once(Rectangle::new([(left, 0.0), (right, *v)], color.filled()))).map_err(draw_err)?;
                    let (l, t) = chart.backend_coord(&(left, v.max(0.0)));
                    let (r, b) = chart.backend_coord(&(right, v.min(0.0)));
                    rects.push(BarRect { panel: k, group: g, series: s, rect: (l, t, r, b), color });
                    let text = format!("{}{}", fmt_number(*v), panel.unit);
                    let (px, py) = chart.backend_coord(&(mid, *v));
                    let (dy, vpos) = if *v < 0.0 { (6, VPos::Top) } else { (-6, VPos::Bottom) };
                    root.draw(&Text::new(text, (px, py + dy), label_style.pos(Pos::new(HPos::Center, vpos)))).map_err(draw_err)?;
                }
                None => {
                    // One word a line, stacked up from the zero line: it fits the bar's width.
                    let (px, py) = chart.backend_coord(&(mid, 0.0));
                    for (i, word) in missing.split_whitespace().rev().enumerate() {
                        let y = py - 6 - 20 * i as i32;
                        root.draw(&Text::new(word.to_string(), (px, y), label_style.pos(Pos::new(HPos::Center, VPos::Bottom)))).map_err(draw_err)?;
                    }
                }
            }
        }
    }
    if own_legend {
        let labels: Vec<&str> = panel.series.iter().map(|s| s.label.as_str()).collect();
        let (x, y) = area.get_base_pixel();
        let (w, _) = area.dim_in_pixel();
        draw_legend(root, &labels, x + w as i32 / 2, y + 40)?;
    }
    Ok(rects)
}

/// A small fixed-width table of (step, loss, lr, grad_norm, tokens/s) rows, for stderr.
pub fn text_table(rows: &[(i64, f32, f32, f32, f32)]) -> String {
    let mut s = format!("{:>7} {:>9} {:>10} {:>9} {:>10}\n", "step", "loss", "lr", "grad_norm", "tokens/s");
    for (step, loss, lr, gn, tps) in rows {
        s.push_str(&format!("{step:>7} {loss:>9.4} {lr:>10.3e} {gn:>9.3} {tps:>10.0}\n"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_nice_and_cover_the_range() {
        assert_eq!(nice_ticks(0.0, 10.0, 5), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        assert_eq!(nice_ticks(1.37, 7.9, 6), vec![2.0, 4.0, 6.0]);
        assert_eq!(nice_ticks(0.013, 0.05, 4), vec![0.02, 0.03, 0.04, 0.05]);
    }

    #[test]
    fn bar_axes_hold_every_value_and_a_percent_axis_reaches_ten() {
        let (y0, y1) = bar_range([0.0, 0.0].into_iter(), "%");
        assert_eq!(y0, 0.0);
        assert!((y1 - 11.4).abs() < 1e-9, "{y1}");
        let (y0, y1) = bar_range([40.0, 71.0].into_iter(), "%");
        assert_eq!(y0, 0.0);
        assert!(y1 > 71.0 && y1 < 82.0, "{y1}");
        let (y0, y1) = bar_range([-1.0, 0.5].into_iter(), "");
        assert!(y0 < -1.0 && y1 > 0.5, "{y0} {y1}");
        let (y0, y1) = bar_range([0.0].into_iter(), "");
        assert_eq!((y0, y1), (0.0, 0.14));
    }

    #[test]
    fn numbers_read_as_a_person_writes_them() {
        assert_eq!(fmt_number(32764.0), "32,764");
        assert_eq!(fmt_number(-1234567.4), "-1,234,567");
        assert_eq!(fmt_number(69.0), "69");
        assert_eq!(fmt_number(68.26), "68.3");
        assert_eq!(fmt_number(-1.795), "-1.79");
        assert_eq!(fmt_number(0.0246), "0.025");
        assert_eq!(fmt_number(2e-5), "2.0e-5");
    }

    /// A loss that falls tenfold every 10 steps is a straight line on the log axis; an epoch's
    /// end is a red vertical line at its step.
    #[test]
    fn a_loss_is_drawn_on_a_log_axis_with_its_epochs_marked() {
        let (w, h) = curve_size();
        let pts: Vec<(f64, f64)> = (1..=40).map(|s| (s as f64, 10f64.powf(-(s as f64) / 10.0))).collect();
        let style = CurveStyle { log_y: true, marks: vec![(20.0, "epoch 1".into())], xlabel: "step (an epoch is 20 steps)".into() };
        let mut rgb = vec![0u8; (w * h * 3) as usize];
        {
            let root = BitMapBackend::with_buffer(&mut rgb, (w, h)).into_drawing_area();
            root.fill(&WHITE).unwrap();
            draw_curve(&root, &pts, "sft loss", "loss", &style).unwrap();
            root.present().unwrap();
        }
        let is = |x: u32, y: u32, c: RGBColor| rgb[((y * w + x) * 3) as usize..][..3] == [c.0, c.1, c.2];
        // The curve's centre row in columns across the plot.
        let centre = |x: u32| -> Option<f64> {
            let ys: Vec<u32> = (0..h).filter(|&y| is(x, y, CURVE)).collect();
            (!ys.is_empty()).then(|| ys.iter().sum::<u32>() as f64 / ys.len() as f64)
        };
        let cols: Vec<(f64, f64)> = (0..w).step_by(20).filter_map(|x| centre(x).map(|y| (x as f64, y))).collect();
        assert!(cols.len() > 30, "the curve spans the plot: {} columns", cols.len());
        let (a, b) = (cols[2], cols[cols.len() - 3]);
        let worst = cols[2..cols.len() - 2].iter().map(|&(x, y)| (y - (a.1 + (b.1 - a.1) * (x - a.0) / (b.0 - a.0))).abs()).fold(0.0, f64::max);
        assert!(worst < 4.0, "not a straight line on a log axis: {worst} px off");
        // The mark: a long vertical run of red pixels in one column.
        let red = (0..w).map(|x| (0..h).filter(|&y| is(x, y, MARK)).count()).max().unwrap();
        assert!(red > h as usize / 2, "no epoch mark ({red} red pixels in a column)");
    }

    #[test]
    fn png_is_written_atomically_and_is_a_png() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("loss.png");
        let pts: Vec<(f64, f64)> = (1..=50).map(|i| (i as f64, 6.0 / (i as f64).sqrt())).collect();
        write_loss_png(&p, &pts, "sft loss", &[20, 40], 20).unwrap();
        let bytes = std::fs::read(&p).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "no temp file left");
        assert!(write_loss_png(&dir.path().join("x.svg"), &pts, "t", &[], 0).is_err());
    }
}
