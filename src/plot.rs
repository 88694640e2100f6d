//! Loss curves: the loss and every logged metric against the step, one panel each, drawn with
//! `plotters` as SVG. Only its SVG backend is built, with no font feature: text goes into the
//! SVG as `<text>` for the viewer to render, so nothing depends on the system's fonts.
//!
//! A panel whose values are all positive and span two decades or more (a loss, usually) has
//! a log-scale y axis, and its title says so.
//!
//! Axes must have a finite span that `plotters` can cut into ticks (it panics on an infinite
//! one and loops forever on a log axis reaching subnormal numbers), so a point is drawn only
//! when its step and value lie within f32's range (a NaN or infinite loss has no place on the
//! axis either), and a log axis only between f32's smallest normal number and its largest.
//! A plot has at most [`MAX_SERIES`] panels; [`Curves::notes`] says what was left out (series
//! beyond them, points that have no place on an axis).
//!
//! The points come from a metrics log (`rumus run --metrics`, JSON lines: `{"step", "loss"}`
//! for a training step, `{"step", "metric", "value"}` for `log_metric`) or from the run itself
//! (`rumus run --plot`).

use crate::err;
use crate::error::{Error, Result};
use plotters::prelude::*;
use std::path::Path;

/// Named series of `(step, value)` points, in the order they first appeared ("loss" first).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Curves {
    series: Vec<(String, Vec<(f64, f64)>)>,
    /// The first series beyond [`MAX_SERIES`] (its points are not kept).
    beyond: Option<String>,
    /// Points left out: NaN, infinite or beyond f32's range.
    left_out: u64,
}

/// Most series (panels) one plot draws.
pub const MAX_SERIES: usize = 64;

/// Largest step or value drawn: f32's largest.
const MAX_MAGNITUDE: f64 = f32::MAX as f64;

/// Most bytes of a metrics log `rumus plot` reads.
pub const MAX_LOG_BYTES: u64 = 1 << 30;

impl Curves {
    /// Add a point to series `name`; a step or value beyond f32's range, NaN or infinite is
    /// left out (see the module documentation).
    pub fn push(&mut self, name: &str, step: f64, value: f64) {
        if !(step.abs() <= MAX_MAGNITUDE && value.abs() <= MAX_MAGNITUDE) {
            self.left_out += 1;
            return;
        }
        if let Some((_, points)) = self.series.iter_mut().find(|(n, _)| n == name) {
            points.push((step, value));
        } else if self.series.len() >= MAX_SERIES {
            self.beyond.get_or_insert_with(|| name.to_string());
        } else if name == "loss" {
            self.series.insert(0, (name.into(), vec![(step, value)]));
        } else {
            self.series.push((name.into(), vec![(step, value)]));
        }
    }

    /// What the plot leaves out, one sentence each: series beyond [`MAX_SERIES`], points that
    /// are NaN, infinite or beyond f32's range. For a warning beside the plot.
    pub fn notes(&self) -> Vec<String> {
        let mut notes = Vec::new();
        if let Some(name) = &self.beyond {
            notes.push(format!(
                "series from `{name}` on are not drawn: a plot has at most {MAX_SERIES} panels, one per series; log fewer metric names"
            ));
        }
        if self.left_out > 0 {
            notes.push(format!(
                "{} points are not drawn: NaN, infinite or beyond f32's range",
                self.left_out
            ));
        }
        notes
    }

    /// The series' names, in drawing order.
    pub fn names(&self) -> Vec<&str> {
        self.series.iter().map(|(n, _)| n.as_str()).collect()
    }

    /// The points of a metrics log's text (`name` is the file, for errors `file:line: ...`).
    /// Lines that are neither a step nor a metric are skipped; a line that is not JSON is an
    /// error.
    pub fn from_log(name: &str, text: &str) -> Result<Curves> {
        let mut curves = Curves::default();
        for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            let v: serde_json::Value = serde_json::from_str(line)
                .map_err(|e| err!(Data, "{name}:{}: not a JSON line: {e}", i + 1))?;
            let num = |key: &str| v.get(key).and_then(serde_json::Value::as_f64);
            let Some(step) = num("step") else { continue };
            if let Some(loss) = num("loss") {
                curves.push("loss", step, loss);
            }
            if let (Some(metric), Some(value)) =
                (v.get("metric").and_then(serde_json::Value::as_str), num("value"))
            {
                curves.push(metric, step, value);
            }
        }
        Ok(curves)
    }

    /// Why there is nothing to draw, if so: no points, or none within f32's range.
    pub fn nothing_to_draw(&self) -> Option<String> {
        match (self.series.is_empty(), self.left_out) {
            (false, _) => None,
            (true, 0) => Some("nothing to plot: no steps and no metrics".into()),
            (true, n) => Some(format!(
                "nothing to plot: the {n} points logged are all NaN, infinite or beyond f32's range"
            )),
        }
    }

    /// The curves as an SVG document: one panel per series, against the step.
    pub fn svg(&self) -> Result<String> {
        if let Some(why) = self.nothing_to_draw() {
            return Err(err!(InvalidArgument, "{why}"));
        }
        let mut svg = String::new();
        let height = 280 * self.series.len() as u32;
        {
            let root = SVGBackend::with_string(&mut svg, (900, height)).into_drawing_area();
            root.fill(&WHITE).map_err(draw_err)?;
            let panels = root.split_evenly((self.series.len(), 1));
            for ((name, points), panel) in self.series.iter().zip(&panels) {
                let (x0, x1) = padded(points.iter().map(|p| p.0), 0.0);
                let log = log_range(points.iter().map(|p| p.1));
                // A metric's name is any script string: control and invisible characters are
                // escaped (most are not allowed in XML at all).
                let name = crate::error::escape(name);
                let caption = match log {
                    Some(_) => format!("{name} (log scale)"),
                    None => name.into_owned(),
                };
                let mut builder = ChartBuilder::on(panel);
                builder
                    .caption(caption, ("sans-serif", 20))
                    .margin(12)
                    .x_label_area_size(36)
                    .y_label_area_size(64);
                // Steps are whole numbers: a tick between two has no label (a run of two steps
                // read `1 1 1 1 1 2 2 2 2 2`).
                let whole = |x: &f64| match (x - x.round()).abs() < 1e-9 {
                    true => format!("{x:.0}"),
                    false => String::new(),
                };
                let line = LineSeries::new(points.iter().copied(), BLUE.stroke_width(2));
                // A lone point makes no line: it is drawn as a dot.
                let dot = (points.len() == 1).then(|| Circle::new(points[0], 4, BLUE.filled()));
                // The two axes are different types, so the same drawing is written for each.
                if let Some((y0, y1)) = log {
                    let y = (y0..y1).log_scale();
                    let mut chart = builder.build_cartesian_2d(x0..x1, y).map_err(draw_err)?;
                    let mut mesh = chart.configure_mesh();
                    let ticks = |y: &f64| tick(*y, *y / 10.0);
                    mesh.x_desc("step").x_label_formatter(&whole).y_label_formatter(&ticks);
                    mesh.draw().map_err(draw_err)?;
                    chart.draw_series(line).map_err(draw_err)?;
                    chart.draw_series(dot).map_err(draw_err)?;
                } else {
                    let (y0, y1) = padded(points.iter().map(|p| p.1), 0.05);
                    let mut chart = builder.build_cartesian_2d(x0..x1, y0..y1).map_err(draw_err)?;
                    let mut mesh = chart.configure_mesh();
                    let ticks = |y: &f64| tick(*y, (y1 - y0) / 10.0);
                    mesh.x_desc("step").x_label_formatter(&whole).y_label_formatter(&ticks);
                    mesh.draw().map_err(draw_err)?;
                    chart.draw_series(line).map_err(draw_err)?;
                    chart.draw_series(dot).map_err(draw_err)?;
                }
            }
            root.present().map_err(draw_err)?;
        }
        Ok(svg)
    }

    /// Write the SVG to `path` (atomically).
    pub fn write_svg(&self, path: &Path) -> Result<()> {
        crate::files::write_atomic(path, self.svg()?.as_bytes())
    }
}

/// `rumus plot LOG -o OUT`: read a metrics log and write its curves as SVG; returns
/// [`Curves::notes`], what the plot leaves out.
pub fn plot_log(log: &Path, out: &Path) -> Result<Vec<String>> {
    let name = log.display().to_string();
    crate::files::check_output("--output", out, "the log", log, crate::files::Output::File)?;
    // Room for the buffer's doubling past the limit, so that the limit's own message is given.
    let mut charge = crate::memory::Budget::new(2 * MAX_LOG_BYTES + (1 << 20)).empty();
    let file = crate::files::open_regular(log)?;
    // A longer log is an error, before reading it if its size says so, else (it grows) one byte
    // past the limit: it was cut at the limit and its first gigabyte drawn without a word.
    let too_long = || {
        err!(
            Limit,
            "{name}: a metrics log may have at most {MAX_LOG_BYTES} bytes; this one has more: plot a part of it (`tail -c`, or `grep` a metric's lines)"
        )
    };
    if file.metadata().is_ok_and(|m| m.len() > MAX_LOG_BYTES) {
        return Err(too_long());
    }
    let file = std::io::Read::take(file, MAX_LOG_BYTES + 1);
    let bytes = crate::memory::read_all(file, &mut charge, &name)?;
    if bytes.len() as u64 > MAX_LOG_BYTES {
        return Err(too_long());
    }
    let text = crate::files::utf8_text(&name, bytes)?;
    let curves = Curves::from_log(&name, &text)?;
    curves.write_svg(out)?;
    Ok(curves.notes())
}

/// The y range of a panel drawn on a log scale: values all positive and spanning at least two
/// decades (a loss falling from 4 to 0.01 is a flat line at zero on a linear axis after its
/// first hundred steps), none below f32's smallest normal number, widened by a tenth of a
/// decade each side. `None` for a linear axis.
fn log_range(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| (a.min(v), b.max(v)));
    let pad = 10f64.powf(0.1);
    (lo >= f64::from(f32::MIN_POSITIVE) && hi >= 100.0 * lo).then(|| (lo / pad, hi * pad))
}

/// The range of `values`, widened by `pad` of its span on each side; when every value is the
/// same, by a twentieth of its magnitude, at least 0.5 (a constant 1e20 widened by 0.5 was a
/// span of zero in f64, an axis without ticks).
fn padded(values: impl Iterator<Item = f64>, pad: f64) -> (f64, f64) {
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| (a.min(v), b.max(v)));
    if hi > lo {
        (lo - pad * (hi - lo), hi + pad * (hi - lo))
    } else {
        let w = (lo.abs() / 20.0).max(0.5);
        (lo - w, lo + w)
    }
}

/// A value axis's tick label, `step` about the ticks' spacing: the digits that tell ticks
/// `step` apart and no more, in exponent form from 1e5 up or below 1e-3 (a tick of
/// 95000000000000000000.0 overran its label area; a loss between 0.00121 and 0.00129 needs
/// five decimals, 1e6 ± 1 seven digits).
fn tick(v: f64, step: f64) -> String {
    let a = v.abs();
    // The decimal place of the step's leading digit, and of the value's.
    let place = |x: f64| x.abs().log10().floor() as i32;
    let step_place = if step.is_finite() && step > 0.0 { place(step) } else { place(a.max(1e-300)) - 3 };
    if a != 0.0 && !(1e-3..1e5).contains(&a) {
        let digits = (place(v) - step_place).clamp(1, 15) as usize;
        return format!("{v:.digits$e}");
    }
    let decimals = (-step_place).clamp(0, 15) as usize;
    let s = format!("{v:.decimals$}");
    let s = match s.contains('.') {
        true => s.trim_end_matches('0').trim_end_matches('.'),
        false => &s,
    };
    match s {
        "-0" => "0".to_string(),
        s => s.to_string(),
    }
}

fn draw_err(e: impl std::fmt::Display) -> Error {
    err!(Io, "drawing the plot failed: {e}")
}
