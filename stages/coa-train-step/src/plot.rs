//! The loss curve as a PNG (plotters' bitmap backend) and as a small text table.
//!
//! plotters is built without its font features (they need system font libraries), so the tick
//! labels and titles are drawn here with font8x8's public-domain 8x8 bitmap glyphs, scaled.

use std::path::Path;

use anyhow::{bail, Context, Result};
use coa_schemas::output::TempFile;
use font8x8::{UnicodeFonts, BASIC_FONTS};
use plotters::prelude::*;

const WIDTH: u32 = 900;
const HEIGHT: u32 = 540;
const LEFT: i32 = 90;
const RIGHT: i32 = 30;
const TOP: i32 = 50;
const BOTTOM: i32 = 60;

/// Draws `text` with its top-left corner at (x, y), each font pixel `scale` pixels wide.
fn draw_text<DB: DrawingBackend>(area: &DrawingArea<DB, plotters::coord::Shift>, text: &str, x: i32, y: i32, scale: i32, color: &RGBColor) -> Result<()> {
    for (i, ch) in text.chars().enumerate() {
        let glyph = BASIC_FONTS.get(ch).or_else(|| BASIC_FONTS.get('?')).unwrap_or([0; 8]);
        for (row, bits) in glyph.iter().enumerate() {
            for col in 0..8 {
                if bits & (1 << col) != 0 {
                    let x0 = x + (i as i32 * 8 + col) * scale;
                    let y0 = y + row as i32 * scale;
                    area.draw(&Rectangle::new([(x0, y0), (x0 + scale - 1, y0 + scale - 1)], color.filled()))
                        .map_err(|e| anyhow::anyhow!("drawing text: {e}"))?;
                }
            }
        }
    }
    Ok(())
}

fn text_width(text: &str, scale: i32) -> i32 {
    text.chars().count() as i32 * 8 * scale
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

fn fmt_tick(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let a = v.abs();
    if a >= 1e5 || a < 1e-3 {
        format!("{v:.1e}")
    } else if a >= 100.0 || (v.fract() == 0.0) {
        format!("{v:.0}")
    } else if a >= 1.0 {
        format!("{v:.2}").trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        format!("{v:.3}").trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// Writes the loss curve (`points` = (step, loss)) to `path` as a PNG, atomically.
pub fn write_loss_png(path: &Path, points: &[(f64, f64)], title: &str) -> Result<()> {
    write_curve_png(path, points, title, "loss")
}

/// Writes a curve (`points` = (step, value)) to `path` as a PNG, atomically; `ylabel` names
/// the value.
pub fn write_curve_png(path: &Path, points: &[(f64, f64)], title: &str, ylabel: &str) -> Result<()> {
    let finite: Vec<(f64, f64)> = points.iter().copied().filter(|(x, y)| x.is_finite() && y.is_finite()).collect();
    if finite.is_empty() {
        bail!("--plot {}: no finite {ylabel} values to plot", path.display());
    }
    if path.extension().and_then(|e| e.to_str()).map(|e| e.eq_ignore_ascii_case("png")) != Some(true) {
        bail!("--plot {}: the plot is written as PNG, give a path ending in .png", path.display());
    }
    let (mut x0, mut x1) = finite.iter().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.0), b.max(p.0)));
    let (mut y0, mut y1) = finite.iter().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.1), b.max(p.1)));
    if x1 <= x0 {
        x0 -= 1.0;
        x1 += 1.0;
    }
    if y1 <= y0 {
        y0 -= 0.5;
        y1 += 0.5;
    }
    let pad = (y1 - y0) * 0.05;
    y0 = (y0 - pad).max(if finite.iter().all(|p| p.1 >= 0.0) { 0.0 } else { f64::MIN });
    y1 += pad;

    // The temporary name keeps `.png`: the bitmap backend picks the format from it.
    let (pending, _file) = TempFile::create_keeping_extension(path)?;
    let tmp = pending.tmp_path().to_path_buf();
    let drawn = (|| -> Result<()> {
        let root = BitMapBackend::new(&tmp, (WIDTH, HEIGHT)).into_drawing_area();
        let err = |e: DrawingAreaErrorKind<_>| anyhow::anyhow!("drawing the plot: {e}");
        root.fill(&WHITE).map_err(err)?;
        let plot_area = root.margin(TOP as u32, BOTTOM as u32, LEFT as u32, RIGHT as u32);
        let mut chart = ChartBuilder::on(&plot_area).build_cartesian_2d(x0..x1, y0..y1).map_err(|e| anyhow::anyhow!("drawing the plot: {e}"))?;
        let grey = RGBColor(220, 220, 220);
        let black = RGBColor(0, 0, 0);
        let xt = nice_ticks(x0, x1, 8);
        let yt = nice_ticks(y0, y1, 6);
        for &x in &xt {
            chart.draw_series(std::iter::once(PathElement::new(vec![(x, y0), (x, y1)], grey))).map_err(|e| anyhow::anyhow!("drawing the plot: {e}"))?;
        }
        for &y in &yt {
            chart.draw_series(std::iter::once(PathElement::new(vec![(x0, y), (x1, y)], grey))).map_err(|e| anyhow::anyhow!("drawing the plot: {e}"))?;
        }
        // Axes box.
        chart
            .draw_series(std::iter::once(PathElement::new(vec![(x0, y0), (x1, y0), (x1, y1), (x0, y1), (x0, y0)], black)))
            .map_err(|e| anyhow::anyhow!("drawing the plot: {e}"))?;
        chart
            .draw_series(LineSeries::new(finite.iter().copied(), RGBColor(31, 119, 180).stroke_width(2)))
            .map_err(|e| anyhow::anyhow!("drawing the plot: {e}"))?;
        // Tick labels (backend_coord gives pixel coordinates of the whole image).
        for &x in &xt {
            let (px, py) = chart.backend_coord(&(x, y0));
            let label = fmt_tick(x);
            draw_text(&root, &label, px - text_width(&label, 2) / 2, py + 8, 2, &black)?;
        }
        for &y in &yt {
            let (px, py) = chart.backend_coord(&(x0, y));
            let label = fmt_tick(y);
            draw_text(&root, &label, px - text_width(&label, 2) - 8, py - 8, 2, &black)?;
        }
        draw_text(&root, title, (WIDTH as i32 - text_width(title, 2)) / 2, 14, 2, &black)?;
        draw_text(&root, "step", (WIDTH as i32 - text_width("step", 2)) / 2, HEIGHT as i32 - 22, 2, &black)?;
        draw_text(&root, ylabel, 8, 14, 2, &black)?;
        root.present().map_err(err)?;
        Ok(())
    })();
    drawn.with_context(|| format!("writing --plot {}", path.display()))?;
    pending.commit()
}

/// One panel of a bar chart: its title and (label, value) bars.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct BarPanel {
    pub title: String,
    /// `None` (JSON null): no value (e.g. tokens per solved task when nothing was solved), drawn as "-".
    pub bars: Vec<(String, Option<f64>)>,
}

/// Side-by-side bar panels (e.g. success and tokens per solved task of several systems) as a PNG,
/// written atomically. Each panel has its own scale from 0; values are printed above the bars.
pub fn write_bars_png(path: &Path, title: &str, panels: &[BarPanel]) -> Result<()> {
    if panels.is_empty() || panels.iter().any(|p| p.bars.is_empty()) {
        bail!("{}: nothing to plot (a panel without bars)", path.display());
    }
    // The temporary name keeps `.png`: the bitmap backend picks the format from it.
    let (pending, _file) = TempFile::create_keeping_extension(path)?;
    let tmp = pending.tmp_path().to_path_buf();
    let colors = [RGBColor(127, 127, 127), RGBColor(31, 119, 180), RGBColor(214, 39, 40), RGBColor(44, 160, 44)];
    let black = RGBColor(0, 0, 0);
    let drawn = (|| -> Result<()> {
        let root = BitMapBackend::new(&tmp, (WIDTH, HEIGHT)).into_drawing_area();
        let err = |e: DrawingAreaErrorKind<_>| anyhow::anyhow!("drawing the plot: {e}");
        root.fill(&WHITE).map_err(err)?;
        draw_text(&root, title, (WIDTH as i32 - text_width(title, 2)) / 2, 14, 2, &black)?;
        let panel_w = (WIDTH as i32 - 40) / panels.len() as i32;
        let (top, bottom) = (TOP + 40, HEIGHT as i32 - BOTTOM);
        for (k, panel) in panels.iter().enumerate() {
            let x0 = 20 + k as i32 * panel_w;
            draw_text(&root, &panel.title, x0 + (panel_w - text_width(&panel.title, 2)) / 2, TOP, 2, &black)?;
            let max = panel.bars.iter().filter_map(|b| b.1).filter(|v| v.is_finite()).fold(0.0f64, f64::max).max(1e-12);
            let slot = (panel_w - 40) / panel.bars.len() as i32;
            for (i, (label, v)) in panel.bars.iter().enumerate() {
                let v = v.unwrap_or(f64::NAN);
                let bx = x0 + 20 + i as i32 * slot + slot / 6;
                let bw = slot * 2 / 3;
                let h = if v.is_finite() { ((v / max) * (bottom - top - 30) as f64) as i32 } else { 0 };
                root.draw(&Rectangle::new([(bx, bottom - h), (bx + bw, bottom)], colors[i % colors.len()].filled())).map_err(err)?;
                let text = if v.is_finite() { fmt_tick((v * 10.0).round() / 10.0) } else { "-".into() };
                draw_text(&root, &text, bx + (bw - text_width(&text, 2)) / 2, bottom - h - 20, 2, &black)?;
                draw_text(&root, label, bx + (bw - text_width(label, 2)) / 2, bottom + 10, 2, &black)?;
            }
            root.draw(&PathElement::new(vec![(x0 + 10, bottom), (x0 + panel_w - 10, bottom)], black)).map_err(err)?;
        }
        root.present().map_err(err)?;
        Ok(())
    })();
    drawn.with_context(|| format!("writing {}", path.display()))?;
    pending.commit()
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
    fn png_is_written_atomically_and_is_a_png() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("loss.png");
        let pts: Vec<(f64, f64)> = (1..=50).map(|i| (i as f64, 6.0 / (i as f64).sqrt())).collect();
        write_loss_png(&p, &pts, "sft loss").unwrap();
        let bytes = std::fs::read(&p).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "no temp file left");
        assert!(write_loss_png(&dir.path().join("x.svg"), &pts, "t").is_err());
    }

    #[test]
    fn bar_panels_are_drawn_and_empty_panels_refused() {
        let dir = tempfile::tempdir().unwrap();
        let png = dir.path().join("bars.png");
        let panels = vec![
            BarPanel { title: "success %".into(), bars: vec![("teacher".into(), Some(60.0)), ("SFT".into(), Some(5.0))] },
            BarPanel { title: "tokens".into(), bars: vec![("teacher".into(), Some(9000.0)), ("SFT".into(), None)] },
        ];
        write_bars_png(&png, "t", &panels).unwrap();
        assert_eq!(&std::fs::read(&png).unwrap()[..4], b"\x89PNG");
        let empty = vec![BarPanel { title: "x".into(), bars: vec![] }];
        assert!(write_bars_png(&dir.path().join("e.png"), "t", &empty).is_err());
        assert!(!dir.path().join("e.png").exists());
    }
}
