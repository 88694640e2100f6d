//! Data-parallel training on the GPU: the gradients of a step averaged across ranks between the
//! backward pass and the update, staged through host memory in buckets that overlap with the
//! rest of the backward pass.
//!
//! The averaged values ([`GradSync::values`]: the loss and every gradient) are cut into buckets
//! in the order the plan's kernels finish them (the last layer's gradients first). A step then
//! submits the backward pass in segments, each ending where a bucket's last value is written
//! and followed by a copy of that bucket into a mappable staging buffer; while the GPU runs the
//! next segments, the host maps each bucket as soon as its segment is done, copies it out,
//! averages it across ranks ([`Communicator::all_reduce_mean_into`]), and hands the average to
//! the queue (`write_buffer`), which copies it into the plan's buffers before the next
//! submission.
//! The update segment is submitted after the last bucket.
//!
//! The averaged values must lie in buffers of their own that no kernel writes after their
//! producer (a gradient's place in the gradient arena, the loss), and no kernel of the update
//! may compute from a value of the backward pass that is not averaged; [`Exchange::new`] checks
//! both on the plan and refuses a plan that breaks them.

use super::device::{Dispatch, Gpu};
use crate::backend::GradSync;
use crate::dist::Communicator;
use crate::err;
use crate::error::Result;
use crate::graph::{Graph, NodeId};
use crate::plan::alloc::value_bytes;
use crate::plan::Plan;
use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

/// The most bytes a bucket holds before the next averaged value starts another. A step's values
/// are cut into at least four buckets where they can be, so that the backward pass covers the
/// transfers and collectives of all but the last; large models get buckets of this size, each
/// collective moving megabytes.
const BUCKET_BYTES: u64 = 32 << 20;

/// A group of averaged values staged and averaged together.
struct Bucket {
    /// The dispatch before which every value of the bucket is final.
    ready_at: usize,
    /// `(plan buffer, bytes)` of each value, in staging order.
    ranges: Vec<(usize, u64)>,
    /// Host-readable staging (`MAP_READ | COPY_DST`).
    read: wgpu::Buffer,
    /// The bucket as this rank computed it, copied out of the staging buffer (so that the
    /// collective works on ordinary host memory and the staging buffer is free again at once).
    own: RefCell<Vec<f32>>,
    /// The bucket's average, written back to the device with `Queue::write_buffer` (a mapped
    /// write buffer is write-only in wgpu 30, so a collective cannot receive into it).
    mean: RefCell<Vec<f32>>,
}

/// How one plan averages its gradients across ranks.
pub struct Exchange {
    comm: Arc<dyn Communicator>,
    buckets: Vec<Bucket>,
    /// The first dispatch of the update.
    pub update_at: usize,
    /// What the last step spent in the exchange.
    pub last: Cell<ExchangeTime>,
}

/// Seconds one step spent in the exchange, for benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ExchangeTime {
    /// Waiting for a bucket's segment of the backward pass and its staging copy.
    pub wait: f64,
    /// Copying buckets out of mapped staging memory.
    pub read: f64,
    /// In the collectives.
    pub all_reduce: f64,
    /// Handing the averages to the queue (`write_buffer` copies them into its own staging).
    pub write: f64,
}

impl Exchange {
    /// The exchange of `sync` over `plan`, whose kernel `k` is encoded as dispatches
    /// `starts[k]..starts[k + 1]`.
    pub fn new(
        gpu: &Gpu,
        g: &Graph,
        plan: &Plan,
        sync: &GradSync,
        starts: &[usize],
    ) -> Result<Exchange> {
        let refuse = |why: String| {
            err!(Invariant, "this plan cannot average its gradients across ranks on the gpu: {why}")
        };
        let owner = |id: NodeId| plan.alias[id.index()].unwrap_or(id);
        let backward = |id: NodeId| id.index() < sync.before;
        let first_update = plan
            .kernels
            .iter()
            .position(|k| k.outputs.iter().any(|&o| !backward(o)))
            .unwrap_or(plan.kernels.len());
        if plan.kernels[first_update..].iter().any(|k| k.outputs.iter().any(|&o| backward(o))) {
            return Err(refuse("a kernel of the backward pass runs after the update starts".into()));
        }
        // An update kernel may read a value of the backward pass only once it is averaged.
        let averaged: HashSet<NodeId> = sync.values.iter().map(|&v| owner(v)).collect();
        for k in &plan.kernels[first_update..] {
            for &i in &k.inputs {
                let i = owner(i);
                if backward(i) && !g.node(i).op.is_host_value() && !averaged.contains(&i) {
                    return Err(refuse(format!("the update reads node {}, which is not averaged", i.index())));
                }
            }
        }
        // Each averaged value with the kernel that finishes it, in that order.
        let mut values = Vec::with_capacity(sync.values.len());
        for &v in &sync.values {
            let value = plan
                .value_of(v)
                .ok_or_else(|| refuse(format!("node {} has no buffer of its own", v.index())))?;
            let last = (0..first_update)
                .rev()
                .find(|&k| plan.kernels[k].outputs.iter().any(|&o| owner(o) == owner(v)))
                .ok_or_else(|| refuse(format!("no kernel of the backward pass writes node {}", v.index())))?;
            values.push((last, value.buffer, value_bytes(g, v)));
        }
        values.sort_by_key(|&(k, _, _)| k);
        let total: u64 = values.iter().map(|&(_, _, n)| n).sum();
        let bucket_bytes = (total / 4).clamp(1, BUCKET_BYTES);
        let mut buckets = Vec::new();
        let mut i = 0;
        while i < values.len() {
            // Take values until the bucket is full, and every value its last kernel finishes.
            let mut j = i;
            let mut bytes = 0;
            while j < values.len() && (bytes < bucket_bytes || values[j].0 == values[j - 1].0) {
                bytes += values[j].2;
                j += 1;
            }
            let usage = wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST;
            buckets.push(Bucket {
                ready_at: starts[values[j - 1].0 + 1],
                ranges: values[i..j].iter().map(|&(_, b, n)| (b, n)).collect(),
                read: gpu.buffer("gradient staging", bytes, usage)?,
                own: RefCell::new(vec![0.0; (bytes / 4) as usize]),
                mean: RefCell::new(vec![0.0; (bytes / 4) as usize]),
            });
            i = j;
        }
        Ok(Exchange {
            comm: sync.comm.clone(),
            buckets,
            update_at: starts[first_update],
            last: Cell::new(ExchangeTime::default()),
        })
    }

    /// Run `dispatches[..update_at]` (the forward and backward passes) with every bucket
    /// averaged across ranks and written back by the time it returns (the copies back are
    /// submitted, so later submissions see them). `buffers` are the plan's buffer ranges.
    pub fn run_backward(
        &self,
        gpu: &Gpu,
        dispatches: &[Dispatch],
        buffers: &[(wgpu::Buffer, u64, u64)],
    ) -> Result<()> {
        let mut time = ExchangeTime::default();
        let mut submitted = Vec::with_capacity(self.buckets.len());
        let mut at = 0;
        for b in &self.buckets {
            let mut enc = gpu.device.create_command_encoder(&Default::default());
            let segment: Vec<&Dispatch> = dispatches[at..b.ready_at].iter().collect();
            gpu.encode(&mut enc, &segment);
            let mut to = 0;
            for &(buf, n) in &b.ranges {
                let (src, offset, _) = &buffers[buf];
                enc.copy_buffer_to_buffer(src, *offset, &b.read, to, n);
                to += n;
            }
            submitted.push(gpu.submit(enc)?);
            at = b.ready_at;
        }
        if at < self.update_at {
            let mut enc = gpu.device.create_command_encoder(&Default::default());
            let rest: Vec<&Dispatch> = dispatches[at..self.update_at].iter().collect();
            gpu.encode(&mut enc, &rest);
            gpu.submit(enc)?;
        }
        for (b, index) in self.buckets.iter().zip(submitted) {
            let start = Instant::now();
            gpu.map_after(&[(&b.read, wgpu::MapMode::Read)], index)?;
            time.wait += start.elapsed().as_secs_f64();
            let start = Instant::now();
            let (mut own, mut mean) = (b.own.borrow_mut(), b.mean.borrow_mut());
            let read = match b.read.get_mapped_range(..) {
                Ok(view) => match bytemuck::try_cast_slice::<u8, f32>(&view) {
                    Ok(words) => {
                        own.copy_from_slice(words);
                        Ok(())
                    }
                    Err(e) => Err(err!(Device, "gradient staging is not f32-aligned: {e}")),
                },
                Err(e) => Err(err!(Device, "cannot map gradient staging: {e}")),
            };
            b.read.unmap();
            read?;
            time.read += start.elapsed().as_secs_f64();
            let start = Instant::now();
            self.comm.all_reduce_mean_into(&own, &mut mean)?;
            time.all_reduce += start.elapsed().as_secs_f64();
            let start = Instant::now();
            let mut from = 0;
            for &(buf, n) in &b.ranges {
                let (dst, offset, _) = &buffers[buf];
                let words = &mean[(from / 4) as usize..((from + n) / 4) as usize];
                gpu.write(dst, *offset, bytemuck::cast_slice(words))?;
                from += n;
            }
            time.write += start.elapsed().as_secs_f64();
        }
        self.last.set(time);
        Ok(())
    }
}
