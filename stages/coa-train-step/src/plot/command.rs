//! `coa-train-step plot`: its flags ([`PlotArgs`]) and what it draws: a `metrics` table's curve
//! of any column ([`run_plot`]), or panels of bars or lines from a JSON file ([`run_panels`]),
//! which other pipelines use for their comparison figures.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use arrow::array::{Array, Float32Array, Int64Array};
use coa_schemas::stage::Stage;
use coa_schemas::tables::METRICS;

use crate::plot;

#[derive(clap::Args)]
pub struct PlotArgs {
    /// The `metrics` table (default: stdin).
    #[arg(short = 'i', long, value_name = "FILE")]
    pub input: Option<PathBuf>,
    /// The metrics column to draw against the step: loss, lr, grad_norm, tokens_per_s,
    /// reward_mean, clip_frac, entropy, response_len, logprob_mismatch.
    #[arg(long, default_value = "loss")]
    pub column: String,
    /// Instead of a curve, draw side-by-side panels of grouped bars from this JSON file:
    /// {"title": "...", "panels": [{"title": "...", "ylabel": "...", "xlabel": "...", "unit": "%",
    /// "missing": "none solved", "groups": ["code", "math"], "series": [{"label": "SFT",
    /// "values": [12.5, null]}, ...]}, ...]} (one value per group; null: no value).
    #[arg(long, value_name = "FILE.json", conflicts_with_all = ["input", "column", "lines"])]
    pub bars: Option<PathBuf>,
    /// Instead of a curve, draw side-by-side panels of lines from a JSON file of --bars's shape:
    /// each panel's groups are the x axis in order (e.g. RL iterations), each series a line.
    #[arg(long, value_name = "FILE.json", conflicts_with_all = ["input", "column"])]
    pub lines: Option<PathBuf>,
    /// The PNG to write.
    #[arg(short = 'o', long, value_name = "FILE.png")]
    pub output: PathBuf,
    /// Title drawn above the curve (default: "COLUMN per step").
    #[arg(long)]
    pub title: Option<String>,
}

/// `coa-train-step plot`: the curve, the bars or the lines the flags ask for.
pub fn run(stage: &mut Stage, args: &PlotArgs) -> Result<()> {
    stage.outputs(&[("-o", Some(&args.output))])?;
    match (&args.bars, &args.lines) {
        (Some(json), _) => run_panels(stage, json, &args.output, false),
        (None, Some(json)) => run_panels(stage, json, &args.output, true),
        (None, None) => curve(stage, args.input.as_deref(), &args.output, args.title.as_deref(), &args.column),
    }
}

/// The curve of `column` ([`run_plot`]), refused without a file name to write.
fn curve(stage: &mut Stage, input: Option<&Path>, output: &Path, title: Option<&str>, column: &str) -> Result<()> {
    if output.as_os_str().is_empty() {
        bail!("plot: -o FILE.png is required");
    }
    run_plot(stage, input, output, title, column).context("plot")
}

/// `coa-train-step plot --bars FILE.json` (the pipeline's comparison plot) or `--lines
/// FILE.json` (RL curves per iteration): panels as PNG.
pub fn run_panels(stage: &mut Stage, json: &Path, output: &Path, lines: bool) -> Result<()> {
    let figure = plot::BarFigure::read(json)?;
    if lines {
        plot::write_lines_png(output, &figure)?;
    } else {
        plot::write_bars_png(output, &figure)?;
    }
    stage.add_input_file(json);
    stage.note("plot", output.display().to_string());
    Ok(())
}

/// `coa-train-step plot`: a `metrics` table's curve of `column` (e.g. loss, reward_mean) as PNG.
pub fn run_plot(stage: &mut Stage, input: Option<&Path>, output: &Path, title: Option<&str>, column: &str) -> Result<()> {
    let reader = stage.open(input, &METRICS)?;
    let source = reader.source().to_string();
    let mut pts = Vec::new();
    for batch in reader {
        let batch = batch?;
        stage.add_rows_in(batch.num_rows() as u64);
        let step = batch.column_by_name("step").and_then(|c| c.as_any().downcast_ref::<Int64Array>()).ok_or_else(|| anyhow!("{source}: column `step` is not int64"))?;
        let values = batch
            .column_by_name(column)
            .and_then(|c| c.as_any().downcast_ref::<Float32Array>())
            .ok_or_else(|| anyhow!("{source}: --column {column}: not a float32 column of the metrics table"))?;
        for i in 0..batch.num_rows() {
            if values.is_valid(i) {
                pts.push((step.value(i) as f64, values.value(i) as f64));
            }
        }
    }
    if pts.is_empty() {
        bail!("{source}: the metrics table has no `{column}` values, nothing to plot");
    }
    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    // Named after what it draws unless told otherwise; a loss on a log axis, as in training.
    let title = title.map_or_else(|| format!("{column} per step"), str::to_string);
    let style = plot::CurveStyle { log_y: column == "loss", ..Default::default() };
    plot::write_curve_png(output, &pts, &title, column, &style)?;
    stage.note("plot", output.display().to_string());
    Ok(())
}
