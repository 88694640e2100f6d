//! Data-parallel training on the GPU: the gradients of a step averaged across ranks between the
//! backward pass and the update, in buckets that overlap with the rest of the backward pass.
//!
//! The averaged values ([`GradSync::values`]: the loss and every gradient) are cut into buckets
//! in the order the plan's kernels finish them (the last layer's gradients first). A step then
//! submits the backward pass in segments, each ending where a bucket's last value is written
//! and followed by a copy of that bucket out of the plan's buffers. Two ways to average:
//!
//! - `host-shared`, where every rank runs on one machine ([`Communicator::shares_memory`]) and
//!   every device imports host memory ([`super::host_memory`]): one host region that all ranks
//!   map holds a slot per rank and bucket (twice: even and odd steps). Rank r's segment copies
//!   its bucket into its slot; once that submission is done, a barrier says every rank's bucket
//!   is in host memory, and rank r's next submission copies the other ranks' slots into a
//!   device scratch buffer beside its own values, where one kernel (`shaders/rank_mean.wgsl`)
//!   sums them in rank order, scales by 1/N (so every rank gets the same bits), and the mean is
//!   copied back into the plan's buffers. The GPUs' copies move the bytes; the host only waits
//!   and synchronizes. A slot is written again two steps later, after the barriers of the step
//!   between, by which time every rank's copies out of it are done (each rank enters a barrier
//!   only after its queue finished everything submitted before the segment it waited for).
//! - `staged` otherwise (ranks on several machines, a device without the extension,
//!   `RUMUS_EXCHANGE=staged`): the host maps each bucket's mappable staging buffer as soon as
//!   its segment is done, copies it out, averages it across ranks
//!   ([`Communicator::all_reduce_mean_into`]), and hands the average to the queue
//!   (`write_buffer`), which copies it into the plan's buffers before the next submission.
//!
//! The ranks agree on the way (a collective at plan compile), so all take the same. The update
//! segment is submitted after the last bucket.
//!
//! The averaged values must lie in buffers of their own that no kernel writes after their
//! producer (a gradient's place in the gradient arena, the loss), and no kernel of the update
//! may compute from a value of the backward pass that is not averaged; [`Exchange::new`] checks
//! both on the plan and refuses a plan that breaks them.

use super::device::{note_once, Dispatch, Gpu};
use crate::backend::GradSync;
use crate::codegen::templates::RANK_MEAN;
use crate::dist::{Communicator, NodeRegion, REGION_ALIGN};
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

/// A group of averaged values exchanged together.
struct Bucket {
    /// The dispatch before which every value of the bucket is final.
    ready_at: usize,
    /// `(plan buffer, bytes)` of each value, in exchange order.
    ranges: Vec<(usize, u64)>,
    /// The values' bytes together.
    bytes: u64,
}

impl Bucket {
    /// Record copies of the bucket's values, one after the other, into `dst` from byte `at`.
    fn gather(&self, enc: &mut wgpu::CommandEncoder, buffers: &[(wgpu::Buffer, u64, u64)], dst: &wgpu::Buffer, at: u64) {
        let mut to = at;
        for &(buf, n) in &self.ranges {
            let (src, offset, _) = &buffers[buf];
            enc.copy_buffer_to_buffer(src, *offset, dst, to, n);
            to += n;
        }
    }

    /// Record copies back to the bucket's values from `src`, laid out from byte 0 as
    /// [`Bucket::gather`] lays them.
    fn scatter(&self, enc: &mut wgpu::CommandEncoder, buffers: &[(wgpu::Buffer, u64, u64)], src: &wgpu::Buffer) {
        let mut from = 0;
        for &(buf, n) in &self.ranges {
            let (dst, offset, _) = &buffers[buf];
            enc.copy_buffer_to_buffer(src, from, dst, *offset, n);
            from += n;
        }
    }
}

/// The host-staged exchange's buffers of one bucket.
struct Staged {
    /// Host-readable staging (`MAP_READ | COPY_DST`).
    read: wgpu::Buffer,
    /// The bucket as this rank computed it, copied out of the staging buffer (so that the
    /// collective works on ordinary host memory and the staging buffer is free again at once).
    own: RefCell<Vec<f32>>,
    /// The bucket's average, written back to the device with `Queue::write_buffer` (a mapped
    /// write buffer is write-only in wgpu 30, so a collective cannot receive into it).
    mean: RefCell<Vec<f32>>,
}

/// The exchange through host memory every rank maps and every device imports.
struct Shared {
    /// The region as this device sees it (destroyed on drop, before the region is unmapped).
    host: wgpu::Buffer,
    /// `ranks` copies of the largest bucket, rank k's at `k * bytes` of a bucket's `bytes`.
    scratch: wgpu::Buffer,
    pipeline: wgpu::ComputePipeline,
    /// Per bucket: its offset in a rank's slot, and the mean kernel's bind group (with the
    /// uniform buffer it binds).
    kernels: Vec<(u64, wgpu::BindGroup, wgpu::Buffer)>,
    /// Bytes of one rank's slot (every bucket, each at a multiple of 256 bytes).
    slot: u64,
    rank: usize,
    ranks: usize,
    /// Steps run so far: even and odd steps use the two halves of the region.
    steps: Cell<u64>,
    device: wgpu::Device,
    /// Dropped last.
    _region: NodeRegion,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // The device must be done with the imported memory before it is unmapped.
        self.host.destroy();
        let _ = self.device.poll(wgpu::PollType::wait_indefinitely());
    }
}

enum Way {
    Staged(Vec<Staged>),
    Shared(Box<Shared>),
}

/// How one plan averages its gradients across ranks.
pub struct Exchange {
    comm: Arc<dyn Communicator>,
    buckets: Vec<Bucket>,
    way: Way,
    /// The first dispatch of the update.
    pub update_at: usize,
    /// What the last step spent in the exchange.
    pub last: Cell<ExchangeTime>,
}

/// Seconds one step spent in the exchange, for benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ExchangeTime {
    /// Waiting for a bucket's segment of the backward pass and its copy out.
    pub wait: f64,
    /// Copying buckets out of mapped staging memory (`staged` only).
    pub read: f64,
    /// In the collectives (`host-shared`: the barriers).
    pub all_reduce: f64,
    /// Handing the averages to the queue (`staged`: `write_buffer` copies them into its own
    /// staging; `host-shared`: recording and submitting the copies in and the mean kernels).
    pub write: f64,
    /// `host-shared`: waiting, after the last barrier, until every bucket's mean is in place
    /// (the copies in and the kernels the backward pass did not cover).
    pub tail: f64,
}

impl Exchange {
    /// The exchange of `sync` over `plan`, whose kernel `k` is encoded as dispatches
    /// `starts[k]..starts[k + 1]`. Collective: the ranks agree on the way to average.
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
            buckets.push(Bucket {
                ready_at: starts[values[j - 1].0 + 1],
                ranges: values[i..j].iter().map(|&(_, b, n)| (b, n)).collect(),
                bytes,
            });
            i = j;
        }
        let way = match Shared::agree(gpu, &sync.comm, &buckets)? {
            Some(shared) => Way::Shared(Box::new(shared)),
            None => {
                let usage = wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST;
                let mut staged = Vec::with_capacity(buckets.len());
                for b in &buckets {
                    staged.push(Staged {
                        read: gpu.buffer("gradient staging", b.bytes, usage)?,
                        own: RefCell::new(vec![0.0; (b.bytes / 4) as usize]),
                        mean: RefCell::new(vec![0.0; (b.bytes / 4) as usize]),
                    });
                }
                Way::Staged(staged)
            }
        };
        Ok(Exchange {
            comm: sync.comm.clone(),
            buckets,
            way,
            update_at: starts[first_update],
            last: Cell::new(ExchangeTime::default()),
        })
    }

    /// Which way the gradients are averaged: `host-shared` or `staged`.
    pub fn kind(&self) -> &'static str {
        match self.way {
            Way::Staged(_) => "staged",
            Way::Shared(_) => "host-shared",
        }
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
        let parity = match &self.way {
            Way::Shared(s) => {
                let step = s.steps.get();
                s.steps.set(step + 1);
                step % 2
            }
            Way::Staged(_) => 0,
        };
        for (i, b) in self.buckets.iter().enumerate() {
            let mut enc = gpu.device.create_command_encoder(&Default::default());
            let segment: Vec<&Dispatch> = dispatches[at..b.ready_at].iter().collect();
            gpu.encode(&mut enc, &segment);
            let (dst, slot) = match &self.way {
                Way::Staged(staged) => (&staged[i].read, 0),
                Way::Shared(s) => (&s.host, s.slot_at(parity, s.rank, i)),
            };
            b.gather(&mut enc, buffers, dst, slot);
            submitted.push(gpu.submit(enc)?);
            at = b.ready_at;
        }
        if at < self.update_at {
            let mut enc = gpu.device.create_command_encoder(&Default::default());
            let rest: Vec<&Dispatch> = dispatches[at..self.update_at].iter().collect();
            gpu.encode(&mut enc, &rest);
            gpu.submit(enc)?;
        }
        match &self.way {
            Way::Staged(staged) => self.average_staged(gpu, staged, submitted, buffers, &mut time)?,
            Way::Shared(s) => self.average_shared(gpu, s, parity, submitted, buffers, &mut time)?,
        }
        self.last.set(time);
        Ok(())
    }

    /// Map each bucket once its segment is done, average it on the host, hand it back.
    fn average_staged(
        &self,
        gpu: &Gpu,
        staged: &[Staged],
        submitted: Vec<wgpu::SubmissionIndex>,
        buffers: &[(wgpu::Buffer, u64, u64)],
        time: &mut ExchangeTime,
    ) -> Result<()> {
        for ((b, st), index) in self.buckets.iter().zip(staged).zip(submitted) {
            let start = Instant::now();
            gpu.map_after(&[(&st.read, wgpu::MapMode::Read)], index)?;
            time.wait += start.elapsed().as_secs_f64();
            let start = Instant::now();
            let (mut own, mut mean) = (st.own.borrow_mut(), st.mean.borrow_mut());
            let read = match st.read.get_mapped_range(..) {
                Ok(view) => match bytemuck::try_cast_slice::<u8, f32>(&view) {
                    Ok(words) => {
                        own.copy_from_slice(words);
                        Ok(())
                    }
                    Err(e) => Err(err!(Device, "gradient staging is not f32-aligned: {e}")),
                },
                Err(e) => Err(err!(Device, "cannot map gradient staging: {e}")),
            };
            st.read.unmap();
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
        Ok(())
    }

    /// Once a bucket's segment is done and every rank's is (a barrier), copy the other ranks'
    /// slots in beside this rank's values, average them with one kernel and copy the mean back.
    fn average_shared(
        &self,
        gpu: &Gpu,
        s: &Shared,
        parity: u64,
        submitted: Vec<wgpu::SubmissionIndex>,
        buffers: &[(wgpu::Buffer, u64, u64)],
        time: &mut ExchangeTime,
    ) -> Result<()> {
        let mut last = None;
        for (i, (b, index)) in self.buckets.iter().zip(submitted).enumerate() {
            let start = Instant::now();
            gpu.wait_for(index)?;
            time.wait += start.elapsed().as_secs_f64();
            let start = Instant::now();
            self.comm.barrier()?;
            time.all_reduce += start.elapsed().as_secs_f64();
            let start = Instant::now();
            let mut enc = gpu.device.create_command_encoder(&Default::default());
            b.gather(&mut enc, buffers, &s.scratch, s.rank as u64 * b.bytes);
            for k in (0..s.ranks).filter(|&k| k != s.rank) {
                let from = s.slot_at(parity, k, i);
                enc.copy_buffer_to_buffer(&s.host, from, &s.scratch, k as u64 * b.bytes, b.bytes);
            }
            {
                let (_, bind, _) = &s.kernels[i];
                let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some("rank mean"),
                    timestamp_writes: None,
                });
                pass.set_pipeline(&s.pipeline);
                pass.set_bind_group(0, bind, &[]);
                let [x, y, z] = gpu.dispatch_dims((b.bytes / 4).div_ceil(256) as u32);
                pass.dispatch_workgroups(x, y, z);
            }
            b.scatter(&mut enc, buffers, &s.scratch);
            last = Some(gpu.submit(enc)?);
            time.write += start.elapsed().as_secs_f64();
        }
        if let Some(index) = last {
            let start = Instant::now();
            gpu.wait_for(index)?;
            time.tail = start.elapsed().as_secs_f64();
        }
        Ok(())
    }
}

/// Whether `RUMUS_EXCHANGE` asks for the staged exchange: `staged`; unset, empty or
/// `host-shared` leave the choice to the machine, and anything else is a usage error (a
/// mistyped value used to be ignored). Read where ranks agree on the exchange; every rank of
/// a job has the same environment, so all refuse alike.
pub(crate) fn staged_requested() -> Result<bool> {
    crate::error::env_choice(SWITCH, EXCHANGES)
}

const SWITCH: &str = "RUMUS_EXCHANGE";
const EXCHANGES: &[(&str, bool)] = &[("host-shared", false), ("staged", true)];

impl Shared {
    /// The byte where rank `rank`'s copy of bucket `bucket` starts in the region, for steps of
    /// parity `parity`.
    fn slot_at(&self, parity: u64, rank: usize, bucket: usize) -> u64 {
        (parity * self.ranks as u64 + rank as u64) * self.slot + self.kernels[bucket].0
    }

    /// The host-shared exchange of `buckets`, when every rank can take part; `None` (on every
    /// rank alike) when one cannot. Collective.
    fn agree(gpu: &Gpu, comm: &Arc<dyn Communicator>, buckets: &[Bucket]) -> Result<Option<Shared>> {
        let ranks = comm.world_size();
        if ranks < 2 || !comm.shares_memory() {
            return Ok(None);
        }
        // Every rank says whether it can, and all go ahead only if all can.
        let all = |ok: bool| -> Result<bool> {
            let mut flag = [if ok { 1.0 } else { 0.0 }];
            comm.all_reduce_mean(&mut flag)?;
            Ok(flag[0] == 1.0)
        };
        let mut offsets = Vec::with_capacity(buckets.len());
        let mut slot = 0u64;
        for b in buckets {
            offsets.push(slot);
            slot += b.bytes.next_multiple_of(256);
        }
        let largest = buckets.iter().map(|b| b.bytes).max().unwrap_or(0);
        let scratch = ranks as u64 * largest;
        let region = (2 * ranks as u64 * slot).next_multiple_of(REGION_ALIGN as u64);
        let staged = staged_requested()?;
        let cannot = if staged {
            Some("RUMUS_EXCHANGE=staged".to_string())
        } else if !gpu.host_import.is_some_and(|a| (REGION_ALIGN as u64).is_multiple_of(a)) {
            Some(format!("`{}` does not import host memory at {REGION_ALIGN}-byte alignment", gpu.info.name))
        } else if scratch > gpu.limits.max_storage_buffer_binding_size || region > gpu.limits.max_buffer_size {
            Some(format!("{region} bytes of buckets exceed the device's buffer limits"))
        } else {
            None
        };
        let note = |why: &str| {
            note_once(&format!("note: rank {}: gradients staged through host vectors ({why})", comm.rank()))
        };
        if let Some(why) = &cannot {
            note(why);
        }
        if !all(cannot.is_none())? {
            return Ok(None);
        }
        // A region that cannot be allocated on some rank sends every rank to the staged path.
        let region = comm.node_region(region as usize).unwrap_or_else(|e| {
            note(&e.message);
            None
        });
        if !all(region.is_some())? {
            return Ok(None);
        }
        let Some(region) = region else { return Ok(None) };
        // Every rank keeps the region until all know whether every import worked (freeing an
        // MPI window is collective).
        let built = Shared::build(gpu, &region, scratch, &offsets, buckets, ranks);
        if let Err(e) = &built {
            note(&e.message);
        }
        if !all(built.is_ok())? {
            return Ok(None);
        }
        let (host, scratch, pipeline, kernels) = built?;
        Ok(Some(Shared {
            host,
            scratch,
            pipeline,
            kernels,
            slot,
            rank: comm.rank(),
            ranks,
            steps: Cell::new(0),
            device: gpu.device.clone(),
            _region: region,
        }))
    }

    /// The imported region, the scratch buffer, the mean kernel and each bucket's binding.
    #[allow(clippy::type_complexity)]
    fn build(
        gpu: &Gpu,
        region: &NodeRegion,
        scratch: u64,
        offsets: &[u64],
        buckets: &[Bucket],
        ranks: usize,
    ) -> Result<(wgpu::Buffer, wgpu::Buffer, wgpu::ComputePipeline, Vec<(u64, wgpu::BindGroup, wgpu::Buffer)>)>
    {
        // SAFETY: the region is aligned to REGION_ALIGN, which the device's import alignment
        // divides (checked by `agree`), and outlives the buffer (`Shared` destroys the buffer
        // and waits for the device before the region drops).
        let host = gpu.scoped("cannot import the shared gradient region", || unsafe {
            super::host_memory::import(&gpu.device, region.as_ptr(), region.len() as u64, "gradient region")
        })??;
        let scratch = gpu.storage("gradient scratch", (scratch / 4) as usize)?;
        let pipeline = gpu.pipeline("rank mean", &RANK_MEAN.with_defaults(), "main")?;
        let mut kernels = Vec::with_capacity(buckets.len());
        for (b, &offset) in buckets.iter().zip(offsets) {
            let n = u32::try_from(b.bytes / 4)
                .map_err(|_| err!(Limit, "a gradient bucket of {} bytes is too large", b.bytes))?;
            let params = [n, ranks as u32, (1.0 / ranks as f32).to_bits(), 0];
            let uniform = gpu.uniform("rank mean parameters", bytemuck::cast_slice(&params))?;
            let bind = gpu.bind_group("rank mean", &pipeline, &[&scratch, &uniform])?;
            kernels.push((offset, bind, uniform));
        }
        Ok((host, scratch, pipeline, kernels))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exchange_setting_is_staged_or_host_shared_and_nothing_else() {
        let parse = |v| crate::error::choose(SWITCH, v, EXCHANGES);
        for (v, staged) in
            [(None, false), (Some(""), false), (Some("host-shared"), false), (Some(" staged"), true)]
        {
            assert_eq!(parse(v).unwrap(), staged, "{v:?}");
        }
        let e = parse(Some("stagged")).unwrap_err();
        assert_eq!(
            e.message,
            "RUMUS_EXCHANGE: `stagged` is not `host-shared` (the default) or `staged`"
        );
    }
}
