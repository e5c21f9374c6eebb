//! The figures: the pipeline's comparison plot from what `pipelines/pipeline_report.py` writes
//! for an evaluation directory (fixture: three suites, teacher / SFT / SFT+RL, the SFT model
//! solving no multihop task), drawn for every suite; and `--bars` JSON that is not a figure
//! refused with a line naming the file and what was expected, leaving no PNG.

use std::path::{Path, PathBuf};
use std::process::Command;

use coa_train_step::plot::{self, BarFigure};
use plotters::prelude::*;

fn fixture_eval() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/eval")
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// Runs the pipeline's report script on a copy of the fixture; returns the pipeline.json it wrote.
fn pipeline_json(dir: &Path) -> PathBuf {
    let eval = dir.join("eval");
    copy_dir(&fixture_eval(), &eval);
    let out = Command::new("python3").arg(repo_root().join("pipelines/pipeline_report.py")).arg(&eval).output().expect("python3 (the code sandbox needs it too)");
    assert!(out.status.success(), "pipeline_report.py failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("| multihop | SFT | 200 | 0.0% | 1,716 | - |"), "the table:\n{table}");
    eval.join("pipeline.json")
}

#[test]
fn pipeline_plot_draws_every_suite_and_system() {
    let dir = tempfile::tempdir().unwrap();
    let fig = BarFigure::read(&pipeline_json(dir.path())).unwrap();
    let suites = ["code", "math", "multihop"];
    assert_eq!(fig.panels.len(), 2, "success and tokens per solved task side by side");
    for p in &fig.panels {
        assert_eq!(p.groups, suites);
        assert_eq!(p.series.iter().map(|s| s.label.as_str()).collect::<Vec<_>>(), ["teacher MAS", "SFT", "SFT+RL"]);
        assert!(!p.ylabel.is_empty() && !p.xlabel.is_empty());
    }

    // Drawn into memory: every (suite, system) with a value has its bar, in its series' colour,
    // as tall as its value says; the model that solved nothing has no tokens bar.
    let (w, h) = plot::bars_size(&fig);
    let mut rgb = vec![0u8; (w * h * 3) as usize];
    let rects = {
        let root = BitMapBackend::with_buffer(&mut rgb, (w, h)).into_drawing_area();
        root.fill(&WHITE).unwrap();
        let rects = plot::draw_bars(&root, &fig).unwrap();
        root.present().unwrap();
        rects
    };
    let pixel = |x: i32, y: i32| {
        let i = ((y as u32 * w + x as u32) * 3) as usize;
        RGBColor(rgb[i], rgb[i + 1], rgb[i + 2])
    };
    for (k, panel) in fig.panels.iter().enumerate() {
        let mut heights = Vec::new();
        for (g, suite) in suites.iter().enumerate() {
            for (s, series) in panel.series.iter().enumerate() {
                let bar = rects.iter().find(|r| (r.panel, r.group, r.series) == (k, g, s));
                match series.values[g] {
                    None => assert!(bar.is_none(), "panel {k}: {suite}/{} has no value but a bar", series.label),
                    Some(v) => {
                        let bar = bar.unwrap_or_else(|| panic!("panel {k}: no bar for {suite}/{}", series.label));
                        let (l, t, r, b) = bar.rect;
                        assert!(r > l && b >= t && l >= 0 && r < w as i32 && b < h as i32, "{bar:?}");
                        if b - t >= 4 {
                            assert_eq!(pixel((l + r) / 2, (t + b) / 2), bar.color, "panel {k}: {suite}/{} bar colour", series.label);
                        }
                        heights.push((v, (b - t) as f64));
                    }
                }
            }
        }
        let (vmax, hmax) = heights.iter().copied().fold((0.0, 0.0), |a, x| if x.0 > a.0 { x } else { a });
        for (v, px) in heights {
            assert!((px - v / vmax * hmax).abs() <= 2.0, "panel {k}: a bar of {v} is {px} px tall, the bar of {vmax} {hmax} px");
        }
    }
    let drawn: usize = rects.len();
    assert_eq!(drawn, 9 + 8, "9 success bars and 8 tokens bars (SFT solved no multihop task)");
    // Suites left to right, each suite's bars together.
    let success: Vec<_> = rects.iter().filter(|r| r.panel == 0).collect();
    for g in 0..2 {
        let right_of_g = success.iter().filter(|r| r.group == g).map(|r| r.rect.2).max().unwrap();
        let left_of_next = success.iter().filter(|r| r.group == g + 1).map(|r| r.rect.0).min().unwrap();
        assert!(right_of_g < left_of_next, "suite {g} overlaps suite {}", g + 1);
    }

    // And through the binary, as `make eval` runs it.
    let png = dir.path().join("pipeline.png");
    let out = Command::new(env!("CARGO_BIN_EXE_coa-train-step"))
        .args(["plot", "--bars"])
        .arg(dir.path().join("eval/pipeline.json"))
        .arg("-o")
        .arg(&png)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    // The IHDR chunk: width and height as bars_size says.
    assert_eq!(u32::from_be_bytes(bytes[16..20].try_into().unwrap()), w);
    assert_eq!(u32::from_be_bytes(bytes[20..24].try_into().unwrap()), h);
}

#[test]
fn bars_json_that_is_not_a_figure_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let cases: &[(&str, &str, &[&str])] = &[
        ("not JSON", "{\"title\": \"t\", \"panels\": [", &["EOF", "expected {\"title\": str, \"panels\""]),
        ("the old flat bars", r#"{"title": "t", "panels": [{"title": "p", "bars": [["teacher", 60.0]]}]}"#, &["unknown field `bars`"]),
        (
            "a series one value short",
            r#"{"title": "t", "panels": [{"title": "p", "groups": ["code", "math", "multihop"], "series": [{"label": "SFT", "values": [1, 2]}]}]}"#,
            &["panel 1 (\"p\")", "series \"SFT\" has 2 values for 3 groups"],
        ),
        ("no panels", r#"{"title": "t", "panels": []}"#, &["no panels"]),
        ("a panel without groups", r#"{"title": "t", "panels": [{"title": "p", "groups": [], "series": []}]}"#, &["needs at least one group and one series"]),
        ("a value that is text", r#"{"title": "t", "panels": [{"title": "p", "groups": ["a"], "series": [{"label": "x", "values": ["12%"]}]}]}"#, &["invalid type: string \"12%\""]),
    ];
    for (what, text, expected) in cases {
        let json = dir.path().join("bad.json");
        std::fs::write(&json, text).unwrap();
        let png = dir.path().join("bad.png");
        let out = Command::new(env!("CARGO_BIN_EXE_coa-train-step")).args(["plot", "--bars"]).arg(&json).arg("-o").arg(&png).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{what}: accepted");
        assert!(err.contains(&json.display().to_string()), "{what}: the error does not name the file:\n{err}");
        for e in *expected {
            assert!(err.contains(e), "{what}: expected {e:?} in:\n{err}");
        }
        assert!(!png.exists(), "{what}: a PNG was left");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "{what}: a temporary file was left");
    }
}

#[test]
fn rl_report_writes_a_figure_the_plotter_reads() {
    let dir = tempfile::tempdir().unwrap();
    for (k, reward) in [(1, -1.795), (2, -1.702)] {
        let d = dir.path().join(format!("iter{k}"));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("policy.json"), r#"{"rows_out": 108, "informative_groups": 8, "groups": 27}"#).unwrap();
        std::fs::write(d.join("filter.json"), r#"{"rows_out": 32}"#).unwrap();
        let train = format!(
            r#"{{"reward_mean": {reward}, "response_len": 718.0, "clip_frac": 0.008, "entropy": 1.619, "logprob_mismatch": 0.0, "mean_loss": 0.2246, "steps": 3}}"#
        );
        std::fs::write(d.join("train.json"), train).unwrap();
        std::fs::write(d.join("score.json"), format!(r#"{{"rows_in": 40, "rows_out": 40, "correct": {}}}"#, 8 + 4 * k)).unwrap();
    }
    let out = Command::new("python3").arg(repo_root().join("pipelines/rl_report.py")).arg(dir.path()).arg("2").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let fig = BarFigure::read(&dir.path().join("curves.json")).unwrap();
    assert!(fig.panels.iter().all(|p| p.groups == ["1", "2"] && p.xlabel == "RL iteration" && !p.ylabel.is_empty()));
    let titles: Vec<&str> = fig.panels.iter().map(|p| p.title.as_str()).collect();
    assert_eq!(titles, ["Reward", "Success", "Response length", "Entropy"]);
    assert_eq!(fig.panels[1].series[0].values, [Some(30.0), Some(40.0)], "success: correct / rollouts, in %");
    // Drawn as lines, one panel per curve: a line of the curve's colour crosses each panel.
    let png = dir.path().join("curves.png");
    plot::write_lines_png(&png, &fig).unwrap();
    assert!(std::fs::read(&png).unwrap().starts_with(b"\x89PNG"));
    let (w, h) = plot::bars_size(&fig);
    let mut rgb = vec![0u8; (w * h * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut rgb, (w, h)).into_drawing_area();
        root.fill(&WHITE).unwrap();
        plot::draw_lines(&root, &fig).unwrap();
        root.present().unwrap();
    }
    let blue = |x: u32, y: u32| rgb[((y * w + x) * 3) as usize..][..3] == [31, 119, 180];
    for k in 0..4 {
        let panel = (k * w / 4)..((k + 1) * w / 4);
        assert!(panel.clone().any(|x| (0..h).any(|y| blue(x, y))), "panel {k} has no line");
    }
}
