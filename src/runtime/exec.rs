//! Executing a plan on the GPU.
//!
//! [`GpuPlan::new`] does all the work that can be done once: it creates the plan's buffers
//! (persistent values come from the caller, so several plans over one graph share them),
//! generates and compiles every kernel, and binds every buffer. [`GpuPlan::step`] then uploads
//! the inputs, encodes every dispatch into one compute pass, copies updated persistent values
//! into place, and reads back the values asked for with the plan's status in the same
//! submission. A failed check (an index or label out of range) comes back as the error the CPU
//! reference gives, and the step's updates are not applied. A micro-batch run of gradient
//! accumulation encodes only the dispatches of the plan's [`crate::plan::MicroBatch`] kernels
//! and applies only its updates.

use super::device::{Dispatch, Gpu, Readback, STORAGE};
use super::exchange::Exchange;
use super::launch::{Launcher, Range, Resources};
use crate::backend::GradSync;
use crate::codegen;
use crate::cpu::nn::{check_index, check_label};
use crate::err;
use crate::error::{Error, Result};
use crate::graph::{Graph, NodeId, Op};
use crate::plan::limits::{checked_operand, checks_data};
use crate::plan::Plan;
use crate::tensor::{DType, Tensor};
use crate::backend::RunOptions;
use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

/// A plan with its pipelines, bind groups and buffers, ready to run.
pub struct GpuPlan {
    pub plan: Plan,
    /// One wgpu buffer range per plan buffer: (buffer, offset, bytes).
    buffers: Vec<(wgpu::Buffer, u64, u64)>,
    /// Every dispatch of a step, in order (a kernel may need more than one, or none).
    dispatches: Vec<Dispatch>,
    /// For each kernel, how many dispatches it encodes (for reports).
    pub dispatches_per_kernel: Vec<usize>,
    /// Holds the step counter that dropout masks read and whether the step trains (dropout
    /// and `training_select` read it).
    meta: wgpu::Buffer,
    /// Bytes of the scratch and filled buffers programs use outside the plan's buffers.
    pub scratch_bytes: u64,
    /// Per-step copies of updated values onto their persistent buffers: (from, to, bytes).
    /// With a status buffer they are guarded kernels among the dispatches instead.
    copies: Vec<(usize, usize, u64)>,
    /// The status buffer checking kernels report into (see `codegen::wgsl`), when the plan
    /// has checking kernels, and its length in words.
    status: Option<(wgpu::Buffer, usize)>,
    /// Data-parallel training's average of the gradients across ranks, inside every step.
    pub exchange: Option<Exchange>,
    /// A micro-batch run's dispatches (indices into `dispatches`: its kernels', then its
    /// updates' commits) and copies (indices into `copies`), when the plan has one.
    micro: Option<(Vec<usize>, Vec<usize>)>,
    /// The next step's commands, recorded while this step ran on the device.
    prepared: Mutex<Option<Prepared>>,
}

/// A step's commands recorded ahead of time: finishing a command buffer costs the host about
/// 3 µs a dispatch on the H200 (0.8 ms for `gpt-small`'s 292), so [`GpuPlan::run`] records
/// the next step's while the device runs this one, and the next step only submits them.
/// The commands do not depend on a step's inputs (those are written to the plan's buffers
/// before the submission), only on which run it is and what it reads back.
struct Prepared {
    /// A micro-batch run, and the values read back.
    key: (bool, Vec<NodeId>),
    commands: wgpu::CommandBuffer,
    readback: Readback,
}

/// Shape and dtype of a node, for host tensors read back.
fn host_tensor(g: &Graph, id: NodeId, words: Vec<u32>) -> Result<Tensor> {
    let shape = g.shape(id);
    match g.dtype(id) {
        DType::F32 => Tensor::f32(shape, words.into_iter().map(f32::from_bits).collect()),
        DType::I32 => Tensor::i32(shape, words.into_iter().map(|w| w as i32).collect()),
    }
}

impl GpuPlan {
    /// Build everything a step needs. `persistent` supplies the buffers of inputs, parameters
    /// and state that this plan shares with others; missing ones are created here. `target`
    /// is what codegen generates the kernels for (this device's, with the caller's choices);
    /// a plan with `sync` is not merged ([`codegen::Target::merge_dispatches`]).
    pub fn new(
        gpu: &Gpu,
        g: &Graph,
        plan: Plan,
        persistent: &HashMap<NodeId, wgpu::Buffer>,
        target: codegen::Target,
        sync: Option<&GradSync>,
    ) -> Result<GpuPlan> {
        // The plan may have been built without this device's limits.
        let limits = crate::plan::Limits::of(&gpu.limits);
        crate::plan::limits::check_binding_bytes(g, &plan, limits.max_binding_bytes)?;
        crate::plan::verify::verify(g, &plan, Some(limits.max_storage_buffers))?;
        if gpu.limits.min_storage_buffer_offset_alignment as usize > 4 * crate::plan::arena::ALIGN {
            return Err(err!(
                Device,
                "the adapter aligns storage bindings to {} bytes, more than the 256 WebGPU allows",
                gpu.limits.min_storage_buffer_offset_alignment
            ));
        }
        let mut buffers: Vec<Option<(wgpu::Buffer, u64, u64)>> = vec![None; plan.buffers.len()];
        for (b, info) in plan.buffers.iter().enumerate() {
            if info.within.is_some() {
                continue;
            }
            let owner = plan.values.iter().find(|v| v.buffer == b && v.pinned).map(|v| v.node);
            let buf = match owner.and_then(|id| persistent.get(&id)) {
                Some(buf) => buf.clone(),
                None => gpu.buffer(&format!("plan buffer {b}"), info.bytes, STORAGE)?,
            };
            buffers[b] = Some((buf, 0, info.bytes));
        }
        for (b, info) in plan.buffers.iter().enumerate() {
            if let Some((parent, offset)) = info.within {
                // The parent comes first, its own range already resolved (heap or concat).
                let Some((buf, at, _)) = buffers.get(parent).cloned().flatten() else {
                    return Err(err!(Invariant, "plan buffer {b} lies in a missing buffer"));
                };
                buffers[b] = Some((buf, at + offset, info.bytes));
            }
        }
        let buffers: Vec<(wgpu::Buffer, u64, u64)> = buffers.into_iter().flatten().collect();
        let merge_dispatches = target.merge_dispatches && sync.is_none();
        let target = codegen::Target { merge_dispatches, ..target };
        let programs = codegen::compile(g, &plan, &target)?;
        let meta = gpu.uniform("meta", &[0u8; 16])?;
        let status = match programs.status_words {
            0 => None,
            words => Some((gpu.storage("status", words)?, words)),
        };
        let scratch = programs
            .scratch_words
            .iter()
            .map(|&w| gpu.storage("scratch", w.max(1) as usize))
            .collect::<Result<Vec<_>>>()?;
        let res = Resources {
            buffers: buffers
                .iter()
                .map(|(buffer, offset, bytes)| Range { buffer, offset: *offset, bytes: *bytes })
                .collect(),
            status: status.as_ref().map(|(b, _)| b),
            meta: Some(&meta),
            scratch: scratch.iter().collect(),
        };
        let mut launcher = Launcher::default();
        launcher.compile_all(gpu, programs.all())?;
        let mut dispatches = Vec::new();
        for p in programs.all() {
            dispatches.push(launcher.prepare(gpu, p, &res)?);
        }
        let dispatches_per_kernel: Vec<usize> =
            programs.kernels.iter().map(|k| k.programs.len()).collect();
        let exchange = match sync {
            Some(sync) => {
                let starts: Vec<usize> = std::iter::once(0)
                    .chain(dispatches_per_kernel.iter().scan(0, |at, &n| {
                        *at += n;
                        Some(*at)
                    }))
                    .collect();
                Some(Exchange::new(gpu, g, &plan, sync, &starts)?)
            }
            None => None,
        };
        let micro = programs.micro_batch(&plan);
        Ok(GpuPlan {
            plan,
            dispatches,
            dispatches_per_kernel,
            exchange,
            meta,
            scratch_bytes: programs.scratch_bytes(),
            copies: programs.copies,
            status,
            micro,
            buffers,
            prepared: Mutex::new(None),
        })
    }

    /// The buffer holding node `id` (following views), and the offset in bytes it starts at.
    pub fn buffer_of(&self, id: NodeId) -> Option<(&wgpu::Buffer, u64)> {
        self.plan.value_of(id).map(|v| (&self.buffers[v.buffer].0, self.buffers[v.buffer].1))
    }

    pub fn n_dispatches(&self) -> usize {
        self.dispatches.len()
    }

    fn buf(&self, id: NodeId) -> Result<(&wgpu::Buffer, u64)> {
        self.buffer_of(id)
            .ok_or_else(|| err!(Invariant, "node {} has no buffer in this plan", id.index()))
    }

    /// Run one step: write `feeds`, the step counter and the mode, encode every dispatch (optionally
    /// after filling every reused buffer with NaN), apply the updates, submit once, and read
    /// back `read`.
    pub fn step(
        &self,
        gpu: &Gpu,
        g: &Graph,
        feeds: &[(NodeId, &Tensor)],
        opts: RunOptions,
        read: &[NodeId],
        poison: bool,
    ) -> Result<Vec<Tensor>> {
        self.run(gpu, g, feeds, opts, read, poison, false)
    }

    /// [`GpuPlan::step`] as a micro-batch run of gradient accumulation: only the plan's
    /// micro-batch kernels and updates. An error when the plan has no micro-batch run.
    pub fn micro_batch(
        &self,
        gpu: &Gpu,
        g: &Graph,
        feeds: &[(NodeId, &Tensor)],
        step: u64,
        read: &[NodeId],
        poison: bool,
    ) -> Result<Vec<Tensor>> {
        let opts = RunOptions { training: true, step };
        self.run(gpu, g, feeds, opts, read, poison, true)
    }

    /// The dispatches of a micro-batch run, when the plan has one.
    pub fn n_micro_dispatches(&self) -> Option<usize> {
        self.micro.as_ref().map(|(d, _)| d.len())
    }

    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        gpu: &Gpu,
        g: &Graph,
        feeds: &[(NodeId, &Tensor)],
        opts: RunOptions,
        read: &[NodeId],
        poison: bool,
        micro: bool,
    ) -> Result<Vec<Tensor>> {
        // Feeds first, as on the CPU (a feed names an input, of its dtype and size, and every
        // input this run reads is fed), then their exact shapes, as on the CPU too: a refused
        // run leaves the commands prepared for the next step where they were.
        let described: Vec<_> = feeds.iter().map(|(id, t)| (*id, t.dtype(), t.numel())).collect();
        let reads = |id: NodeId| {
            let by = |k: &usize| self.plan.kernels[*k].inputs.contains(&id);
            read.contains(&id)
                || match (micro, &self.plan.micro) {
                    (true, Some(m)) => m.kernels.iter().any(by),
                    _ => (0..self.plan.kernels.len()).any(|k| by(&k)),
                }
        };
        crate::graph::check_feeds(g, &described, &reads)?;
        crate::graph::check_feed_shapes(g, feeds)?;
        let key = (micro, read.to_vec());
        let prepared = self.prepared.lock().unwrap_or_else(PoisonError::into_inner).take();
        let (commands, readback) = match prepared.filter(|p| p.key == key) {
            Some(p) => (p.commands, p.readback),
            None => self.record(gpu, g, micro, read)?,
        };
        for (id, t) in feeds {
            if let Some((buf, offset)) = self.buffer_of(*id) {
                gpu.write(buf, offset, &t.to_le_bytes())?;
            }
        }
        let mut meta = [0u8; 16];
        meta[..4].copy_from_slice(&(opts.step as u32).to_le_bytes());
        meta[4..8].copy_from_slice(&u32::from(opts.training).to_le_bytes());
        gpu.write(&self.meta, 0, &meta)?;
        if poison {
            for (b, info) in self.plan.buffers.iter().enumerate() {
                if !info.pinned && info.within.is_none() {
                    gpu.write(&self.buffers[b].0, 0, &vec![0xff; info.bytes as usize])?;
                }
            }
        }
        if let Some((status, n)) = &self.status {
            let mut words = vec![u32::MAX; *n];
            words[0] = 0;
            gpu.write(status, 0, bytemuck::cast_slice(&words))?;
        }
        if let Some(ex) = &self.exchange {
            ex.run_backward(gpu, &self.dispatches, &self.buffers)?;
        }
        gpu.scoped("submission failed", || gpu.queue.submit([commands]))?;
        // The next step's commands, recorded while the device runs this one. A failure here
        // is left for the next step to record again and report.
        if let Ok((commands, readback)) = self.record(gpu, g, micro, read) {
            let next = Prepared { key, commands, readback };
            *self.prepared.lock().unwrap_or_else(PoisonError::into_inner) = Some(next);
        }
        let mut bytes = gpu.finish_readback(readback)?;
        let errors = gpu.take_uncaptured_errors();
        if let Some(e) = errors.first() {
            return Err(err!(Device, "step failed on the device: {e}"));
        }
        if self.status.is_some() {
            let status: Vec<u32> = bytemuck::pod_collect_to_vec(&bytes.pop().unwrap_or_default());
            if let Some(e) = self.failed_check(gpu, g, &status)? {
                return Err(e);
            }
        }
        read.iter()
            .zip(bytes)
            .map(|(&id, b)| host_tensor(g, id, bytemuck::pod_collect_to_vec(&b)))
            .collect()
    }

    /// Record a step's commands after the exchange's (if any): its dispatches (a micro-batch
    /// run's when `micro`), the copies of updated values, and the readback of `read` and the
    /// status words.
    fn record(
        &self,
        gpu: &Gpu,
        g: &Graph,
        micro: bool,
        read: &[NodeId],
    ) -> Result<(wgpu::CommandBuffer, Readback)> {
        let (all, copies): (Vec<usize>, Vec<_>) = match (micro, &self.micro) {
            (false, _) => ((0..self.dispatches.len()).collect(), self.copies.iter().collect()),
            (true, Some((d, c))) => (d.clone(), c.iter().map(|&i| &self.copies[i]).collect()),
            (true, None) => {
                return Err(err!(Invariant, "a micro-batch run of a plan that accumulates nothing"))
            }
        };
        // With the exchange, the forward and backward dispatches (the same in a micro-batch
        // run) run inside it, and the rest of the run's own dispatches after it.
        let first = match &self.exchange {
            Some(ex) if all.iter().take(ex.update_at).copied().eq(0..ex.update_at) => ex.update_at,
            Some(_) => return Err(err!(Invariant, "a run whose backward pass the exchange cannot split")),
            None => 0,
        };
        let all: Vec<&Dispatch> = all[first..].iter().map(|&i| &self.dispatches[i]).collect();
        let mut parts = Vec::with_capacity(read.len() + 1);
        for &id in read {
            let (buf, offset) = self.buf(id)?;
            let start = (offset / 4) as usize;
            parts.push((buf, start..start + g.shape(id).iter().product::<usize>()));
        }
        if let Some((status, n)) = &self.status {
            parts.push((status, 0..*n));
        }
        let readback = gpu.readback(&parts)?;
        // A source, or a view of one, is read as the step read it (as on the CPU), before an
        // update writes its new value: its copy comes first, the others' after the dispatches.
        let before: Vec<bool> = read.iter().map(|&id| self.plan.read_before_step(g, id)).collect();
        let early = |i: usize| before.get(i).copied().unwrap_or(false);
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        readback.encode(&mut enc, &parts, early);
        gpu.encode(&mut enc, &all);
        for &&(from, to, bytes) in &copies {
            let ((src, src_at, _), (dst, dst_at, _)) = (&self.buffers[from], &self.buffers[to]);
            enc.copy_buffer_to_buffer(src, *src_at, dst, *dst_at, bytes);
        }
        readback.encode(&mut enc, &parts, |i| !early(i));
        let commands = gpu.scoped("recording the step failed", || enc.finish())?;
        Ok((commands, readback))
    }

    /// The error of the first check that failed in the step whose status words are `status`
    /// (checks in plan order, which is the order the CPU evaluates ops in), with the bad index or
    /// label read back from the value checked: the same error the CPU reference gives.
    fn failed_check(&self, gpu: &Gpu, g: &Graph, status: &[u32]) -> Result<Option<Error>> {
        if status.first().is_none_or(|&w| w == 0) {
            return Ok(None);
        }
        let checking = self.plan.kernels.iter().filter(|k| checks_data(&k.kind));
        for (k, &pos) in checking.zip(&status[1..]) {
            let (Some(&out), Some(operand)) = (k.outputs.last(), checked_operand(g, k)) else {
                continue;
            };
            if pos == u32::MAX {
                continue;
            }
            let values = self.read(gpu, g, operand)?;
            let value = values.as_i32().and_then(|v| v.get(pos as usize)).copied();
            let value = value.ok_or_else(|| {
                err!(
                    Invariant,
                    "node {} reported element {pos} of node {}",
                    out.index(),
                    operand.index()
                )
            })?;
            let node = g.node(out);
            let checked = match node.op {
                Op::Embedding => check_index("embedding", value, g.shape(node.inputs[0])[0]),
                Op::EmbeddingGrad { vocab } => check_index("embedding_grad", value, vocab),
                Op::CrossEntropy { .. } | Op::CrossEntropyGrad { .. } => {
                    let c = g.shape(node.inputs[0]).last().copied().unwrap_or(0);
                    check_label(node.op.name(), value, c)
                }
                _ => Ok(0),
            };
            return Ok(Some(match checked {
                Err(e) => e.at(node.span),
                Ok(_) => {
                    err!(Invariant, "node {} reported {value}, which is in range", out.index())
                }
            }));
        }
        Ok(Some(err!(Invariant, "a check failed on the device without saying where")))
    }

    /// Read the current contents of a node's buffer.
    pub fn read(&self, gpu: &Gpu, g: &Graph, id: NodeId) -> Result<Tensor> {
        let n: usize = g.shape(id).iter().product();
        let (buf, offset) = self.buf(id)?;
        let start = (offset / 4) as usize;
        let words: Vec<u32> =
            gpu.read_i32_range(buf, start..start + n)?.into_iter().map(|w| w as u32).collect();
        host_tensor(g, id, words)
    }

    /// Time each dispatch alone: `reps` copies of it in one pass and one submission, waited for.
    /// Returns (label, milliseconds per dispatch) in plan order. Buffers hold whatever the last
    /// step left; the figures are for finding hot kernels, not for results.
    pub fn profile(&self, gpu: &Gpu, reps: u32) -> Result<Vec<(String, f64)>> {
        let mut out = Vec::with_capacity(self.dispatches.len());
        for d in &self.dispatches {
            let copies: Vec<&Dispatch> = (0..reps.max(1)).map(|_| d).collect();
            gpu.run(&copies[..1])?;
            let start = std::time::Instant::now();
            gpu.run(&copies)?;
            out.push((
                d.label.clone(),
                start.elapsed().as_secs_f64() * 1e3 / f64::from(reps.max(1)),
            ));
        }
        Ok(out)
    }

    /// Dispatch labels in order, for reports.
    pub fn dispatch_labels(&self) -> Vec<&str> {
        self.dispatches.iter().map(|d| d.label.as_str()).collect()
    }
}
