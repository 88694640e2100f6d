//! The plan's memory picture (`rumus plan FILE --svg OUT.svg`): every value of the step as a
//! rectangle, x from the kernel that first writes it to the last kernel that reads it, y at its
//! bytes in the device memory the plan lays out, coloured by kind.
//!
//! The memory is drawn as one column of bytes: the shared buffers first (from 0), each value at
//! its buffer's offset, so values that reuse the same bytes sit side by side in time in one
//! band; then the pinned buffers (parameters, optimizer state, inputs and results, alive for the
//! whole step; a flat arena's members at their offsets in it); then the executor's scratch. The
//! kernel where the most bytes are live is marked as the peak.
//!
//! Drawn with `plotters` as [`crate::plot`] is: SVG with `<text>` elements, no system fonts.

use super::Plan;
use crate::err;
use crate::error::{Error, Result};
use crate::graph::{Graph, NodeId, Op};
use plotters::prelude::*;

/// What a value is, for its colour.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Computed by the forward pass (inputs and the loss included), or recomputed in the
    /// backward pass (rematerialization).
    Activation,
    /// Computed by the backward pass.
    Gradient,
    /// A parameter of the model.
    Parameter,
    /// The optimizer's state (moments) and the values its update computes.
    OptimizerState,
    /// The executor's scratch buffer (dedicated kernels' workspace).
    Scratch,
}

impl Kind {
    /// Every kind, in legend order.
    pub const ALL: [Kind; 5] =
        [Kind::Activation, Kind::Gradient, Kind::Parameter, Kind::OptimizerState, Kind::Scratch];

    /// The legend's name.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Activation => "activation",
            Kind::Gradient => "gradient",
            Kind::Parameter => "parameter",
            Kind::OptimizerState => "optimizer state",
            Kind::Scratch => "scratch",
        }
    }

    /// The fill colour (red, green, blue).
    pub fn rgb(self) -> (u8, u8, u8) {
        match self {
            Kind::Activation => (0x4c, 0x78, 0xa8),
            Kind::Gradient => (0xf5, 0x85, 0x18),
            Kind::Parameter => (0x54, 0xa2, 0x4b),
            Kind::OptimizerState => (0xb2, 0x79, 0xa2),
            Kind::Scratch => (0x9d, 0x75, 0x5d),
        }
    }
}

/// Where a training step's nodes begin (indices into the graph's node arena): nodes before
/// `backward_start` are forward, then backward up to `update_start`, then the optimizer's.
#[derive(Clone, Copy, Debug)]
pub struct Phases {
    /// The first backward node.
    pub backward_start: usize,
    /// The first optimizer node.
    pub update_start: usize,
}

/// One rectangle: a value (or the scratch) over kernels `[first, last]` at bytes
/// `[offset, offset + bytes)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    /// The value's node; `None` for the scratch.
    pub node: Option<NodeId>,
    pub kind: Kind,
    /// First and last kernel (inclusive) it is live in.
    pub first: usize,
    pub last: usize,
    pub offset: u64,
    pub bytes: u64,
}

/// The picture's contents: blocks, the memory's regions and the peak.
#[derive(Clone, Debug)]
pub struct Layout {
    pub blocks: Vec<Block>,
    pub kernels: usize,
    /// Bytes of the shared buffers (they come first, from 0).
    pub shared_bytes: u64,
    /// Bytes of everything drawn: shared, pinned and scratch.
    pub total_bytes: u64,
    /// The kernel with the most live bytes, and those bytes.
    pub peak: (usize, u64),
}

/// Lay out the values of plan `p` of graph `g` (phases of a training step) and `scratch_bytes`
/// of executor scratch. A flat arena is drawn as its members (its own rectangle would cover
/// theirs).
pub fn layout(g: &Graph, p: &Plan, phases: Phases, scratch_bytes: u64) -> Layout {
    let kernels = p.kernels.len();
    let mut offset = vec![0u64; p.buffers.len()];
    let mut at = 0;
    // Shared buffers from 0, then pinned ones: each top-level buffer at the running total.
    for pinned in [false, true] {
        for (b, info) in p.buffers.iter().enumerate() {
            if info.within.is_none() && info.pinned == pinned {
                offset[b] = at;
                at += info.bytes;
            }
        }
    }
    let shared_bytes = p.planned_bytes();
    for (b, info) in p.buffers.iter().enumerate() {
        if let Some((parent, within)) = info.within {
            offset[b] = offset[parent] + within;
        }
    }
    let mut container = vec![false; p.buffers.len()];
    for info in &p.buffers {
        if let Some((parent, _)) = info.within {
            container[parent] = true;
        }
    }
    let last_kernel = kernels.saturating_sub(1);
    let mut blocks: Vec<Block> = p
        .values
        .iter()
        .filter(|v| !container[v.buffer])
        .map(|v| Block {
            node: Some(v.node),
            kind: kind(g, phases, v.node),
            first: v.lifetime.first.max(0) as usize,
            last: (v.lifetime.last.max(0) as u64).min(last_kernel as u64) as usize,
            offset: offset[v.buffer],
            bytes: v.bytes,
        })
        .collect();
    if scratch_bytes > 0 {
        let (first, last) = (0, last_kernel);
        blocks.push(Block { node: None, kind: Kind::Scratch, first, last, offset: at, bytes: scratch_bytes });
        at += scratch_bytes;
    }
    let live = |k: usize| -> u64 {
        blocks.iter().filter(|b| b.first <= k && k <= b.last).map(|b| b.bytes).sum()
    };
    let peak = (0..kernels).map(|k| (k, live(k))).max_by_key(|&(k, b)| (b, std::cmp::Reverse(k)));
    Layout { peak: peak.unwrap_or((0, 0)), blocks, kernels, shared_bytes, total_bytes: at }
}

/// What a value is: its op for parameters and state, else the phase that computes it (a
/// forward value recomputed in the backward pass is an activation).
fn kind(g: &Graph, phases: Phases, id: NodeId) -> Kind {
    match g.node(id).op {
        Op::Parameter { .. } => Kind::Parameter,
        Op::State { .. } => Kind::OptimizerState,
        _ if id.index() >= phases.update_start => Kind::OptimizerState,
        _ if g.recomputed.iter().any(|&(_, copy)| copy == id) => Kind::Activation,
        _ if id.index() >= phases.backward_start => Kind::Gradient,
        _ => Kind::Activation,
    }
}

const WIDTH: u32 = 1400;
const HEIGHT: u32 = 900;

impl Layout {
    /// The picture as an SVG document, titled `title` (control and invisible characters
    /// escaped: XML has no place for most of them, and a file name may hold any).
    pub fn svg(&self, title: &str) -> Result<String> {
        let title = crate::error::escape(title);
        let (unit, unit_name) = axis_unit(self.total_bytes);
        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
            root.fill(&WHITE).map_err(draw_err)?;
            let x1 = self.kernels.max(1) as f64;
            let y1 = (self.total_bytes.max(1) as f64 / unit) * 1.04;
            let mut chart = ChartBuilder::on(&root)
                .caption(&title, ("sans-serif", 20))
                .margin(16)
                .x_label_area_size(40)
                .y_label_area_size(72)
                .build_cartesian_2d(0.0..x1, 0.0..y1)
                .map_err(draw_err)?;
            let whole = |x: &f64| format!("{x:.0}");
            chart
                .configure_mesh()
                .disable_mesh()
                .x_desc("kernel")
                .y_desc(unit_name)
                .x_label_formatter(&whole)
                .y_label_formatter(&whole)
                .draw()
                .map_err(draw_err)?;
            // A pixel's worth of bytes: each rectangle gives up one at its top and a tenth of
            // a kernel at each end, so neighbours stay apart.
            let pixel = y1 / f64::from(HEIGHT - 120);
            for kind in Kind::ALL {
                let (r, g, b) = kind.rgb();
                let colour = RGBColor(r, g, b);
                let rects: Vec<_> = (self.blocks.iter().filter(|b| b.kind == kind))
                    .map(|b| {
                        let y0 = b.offset as f64 / unit;
                        let h = b.bytes as f64 / unit;
                        let top = y0 + (h - pixel).max(h / 2.0);
                        let x = (b.first as f64 + 0.1, b.last as f64 + 0.9);
                        Rectangle::new([(x.0, y0), (x.1, top)], colour.filled())
                    })
                    .collect();
                if rects.is_empty() {
                    continue;
                }
                chart
                    .draw_series(rects)
                    .map_err(draw_err)?
                    .label(kind.name())
                    .legend(move |(x, y)| {
                        Rectangle::new([(x, y - 6), (x + 14, y + 6)], colour.filled())
                    });
            }
            // The boundary between the shared and the pinned buffers.
            let shared = self.shared_bytes as f64 / unit;
            let line = LineSeries::new([(0.0, shared), (x1, shared)], BLACK.stroke_width(1));
            chart.draw_series(line).map_err(draw_err)?;
            let label = format!(
                "shared buffers below ({}), pinned above",
                crate::memory::human(self.shared_bytes)
            );
            let style = ("sans-serif", 14).into_font().color(&BLACK);
            chart
                .draw_series([Text::new(label, (0.5, shared + 2.0 * pixel), style.clone())])
                .map_err(draw_err)?;
            // The peak: a red line at its kernel, and its figure.
            let (k, bytes) = self.peak;
            let x = k as f64 + 0.5;
            let red = RED.stroke_width(2);
            chart.draw_series(LineSeries::new([(x, 0.0), (x, y1)], red)).map_err(draw_err)?;
            let peak = format!("peak: {} live at kernel {k}", crate::memory::human(bytes));
            let at = (if k as f64 > x1 * 0.7 { x - x1 * 0.25 } else { x + 0.5 }, y1 * 0.985);
            let style = ("sans-serif", 16).into_font().color(&RED);
            chart.draw_series([Text::new(peak, at, style)]).map_err(draw_err)?;
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperRight)
                .background_style(WHITE.mix(0.9))
                .border_style(BLACK)
                .draw()
                .map_err(draw_err)?;
            root.present().map_err(draw_err)?;
        }
        Ok(svg)
    }
}

/// The unit of the byte axis: the largest power of 1024 below `total` (bytes to GiB).
fn axis_unit(total: u64) -> (f64, &'static str) {
    let mut unit = (1.0, "bytes");
    for (i, name) in ["KiB", "MiB", "GiB"].into_iter().enumerate() {
        let size = 1024f64.powi(i as i32 + 1);
        if total as f64 >= size {
            unit = (size, name);
        }
    }
    unit
}

fn draw_err(e: impl std::fmt::Display) -> Error {
    err!(Io, "drawing the plan failed: {e}")
}
