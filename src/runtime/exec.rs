//! Executing a plan on the GPU.
//!
//! [`GpuPlan::new`] does all the work that can be done once: it creates the plan's buffers
//! (persistent values come from the caller, so several plans over one graph share them),
//! generates and compiles every kernel, and binds every buffer. [`GpuPlan::step`] then uploads
//! the inputs, encodes every dispatch into one compute pass, copies updated persistent values
//! into place, and reads back the values asked for with the plan's status in the same
//! submission. A failed check (an index or label out of range) comes back as the error the CPU
//! reference gives, and the step's updates are not applied.

use super::device::{Dispatch, Gpu, STORAGE};
use super::kernels::{
    LayerNorm, LayerNormBackward, LayerNormForward, Matmul, MatmulSpec, MatmulTile, Operand,
};
use crate::codegen::wgsl::{commit_copy, status_words};
use crate::codegen::wgsl::{generate, matmul_epilogue, MatmulEpilogue};
use crate::cpu::nn::{check_index, check_label};
use crate::err;
use crate::error::{Error, Result};
use crate::graph::{Graph, NodeId, Op};
use crate::plan::limits::{checked_operand, checks_data};
use crate::plan::{Kernel, KernelKind, Plan};
use crate::tensor::{fmt_shape, DType, Tensor};
use std::collections::HashMap;

/// A plan with its pipelines, bind groups and buffers, ready to run.
pub struct GpuPlan {
    pub plan: Plan,
    /// One wgpu buffer per plan buffer.
    buffers: Vec<wgpu::Buffer>,
    /// Kernel dispatches in order (a kernel may need more than one).
    dispatches: Vec<Dispatch>,
    /// For each kernel, how many dispatches it encodes (for reports).
    pub dispatches_per_kernel: Vec<usize>,
    /// Holds the step counter that dropout masks read.
    meta: wgpu::Buffer,
    /// Scratch buffers of dedicated kernels (LayerNorm backward partial sums): not planned.
    pub scratch_bytes: u64,
    /// Per-step copies of updated values onto their persistent buffers: (from, to, bytes).
    /// With a status buffer they are guarded kernels among the dispatches instead.
    copies: Vec<(usize, usize, u64)>,
    /// The status buffer checking kernels report into (see `codegen::wgsl`), when the plan
    /// has checking kernels.
    status: Option<wgpu::Buffer>,
    /// The scratch buffer kernels share (see `shared_scratch`).
    shared: Option<wgpu::Buffer>,
    /// Pipelines compiled while building, by their source: kernels of identical layers
    /// generate identical WGSL (sizes are literals, bindings are numbered by use), so a model of
    /// twelve layers compiles the pipelines of one.
    cache: PipelineCache,
}

/// Compiled pipelines by what they were compiled from.
#[derive(Default)]
struct PipelineCache {
    generated: HashMap<String, wgpu::ComputePipeline>,
    matmul: HashMap<String, Matmul>,
    layer_norm: HashMap<usize, LayerNorm>,
}

impl PipelineCache {
    /// The pipeline of a generated module, compiled once per distinct source.
    fn pipeline(&mut self, gpu: &Gpu, label: &str, wgsl: &str) -> Result<wgpu::ComputePipeline> {
        if let Some(p) = self.generated.get(wgsl) {
            return Ok(p.clone());
        }
        let p = gpu.pipeline(label, wgsl, "main")?;
        self.generated.insert(wgsl.to_string(), p.clone());
        Ok(p)
    }

    fn layer_norm(&mut self, gpu: &Gpu, d: usize) -> Result<LayerNorm> {
        if let Some(ln) = self.layer_norm.get(&d) {
            return Ok(ln.clone());
        }
        let ln = LayerNorm::new(gpu, d)?;
        self.layer_norm.insert(d, ln.clone());
        Ok(ln)
    }
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
    /// and state that this plan shares with others; missing ones are created here.
    pub fn new(
        gpu: &Gpu,
        g: &Graph,
        plan: Plan,
        persistent: &HashMap<NodeId, wgpu::Buffer>,
    ) -> Result<GpuPlan> {
        // The plan may have been built without this device's limits.
        let limits = crate::plan::Limits::of(&gpu.limits);
        crate::plan::limits::check_binding_bytes(g, &plan, limits.max_binding_bytes)?;
        crate::plan::verify::verify(g, &plan, Some(limits.max_storage_buffers))?;
        let mut buffers = Vec::with_capacity(plan.buffers.len());
        for (b, info) in plan.buffers.iter().enumerate() {
            let owner = plan.values.iter().find(|v| v.buffer == b && v.pinned).map(|v| v.node);
            match owner.and_then(|id| persistent.get(&id)) {
                Some(buf) => buffers.push(buf.clone()),
                None => {
                    buffers.push(gpu.buffer(&format!("plan buffer {b}"), info.bytes, STORAGE)?)
                }
            }
        }
        let meta = gpu.uniform("meta", &[0u8; 16])?;
        let checks = plan.kernels.iter().any(|k| checks_data(&k.kind));
        let status = if checks { Some(gpu.storage("status", status_words(&plan))?) } else { None };
        let mut out = GpuPlan {
            plan,
            buffers,
            dispatches: Vec::new(),
            dispatches_per_kernel: Vec::new(),
            meta,
            scratch_bytes: 0,
            copies: Vec::new(),
            status,
            cache: PipelineCache::default(),
            shared: None,
        };
        for k in out.plan.kernels.clone() {
            let before = out.dispatches.len();
            out.build_kernel(gpu, g, &k)?;
            out.dispatches_per_kernel.push(out.dispatches.len() - before);
        }
        for &(target, value) in &out.plan.updates.clone() {
            let (Some(t), Some(v)) = (out.plan.value_of(target), out.plan.value_of(value)) else {
                return Err(err!(Invariant, "update of node {} has no buffer", target.index()));
            };
            if t.buffer == v.buffer {
                continue;
            }
            match &out.status {
                // A guarded copy: nothing is committed once a check failed.
                Some(status) => {
                    let words = (t.bytes / 4) as usize;
                    let src = commit_copy(words);
                    let pipeline = out.cache.pipeline(gpu, &src.label, &src.wgsl)?;
                    let (from, to) = (&out.buffers[v.buffer], &out.buffers[t.buffer]);
                    let bind_group = gpu.bind_group(&src.label, &pipeline, &[from, to, status])?;
                    out.dispatches.push(Dispatch {
                        label: src.label,
                        pipeline,
                        bind_group,
                        workgroups: gpu.dispatch_dims(src.workgroups),
                        owned: Vec::new(),
                    });
                }
                None => out.copies.push((v.buffer, t.buffer, t.bytes)),
            }
        }
        Ok(out)
    }

    /// The buffer holding node `id` (following views).
    pub fn buffer_of(&self, id: NodeId) -> Option<&wgpu::Buffer> {
        self.plan.value_of(id).map(|v| &self.buffers[v.buffer])
    }

    pub fn n_dispatches(&self) -> usize {
        self.dispatches.len()
    }

    fn buf(&self, id: NodeId) -> Result<&wgpu::Buffer> {
        self.buffer_of(id)
            .ok_or_else(|| err!(Invariant, "node {} has no buffer in this plan", id.index()))
    }

    fn build_kernel(&mut self, gpu: &Gpu, g: &Graph, k: &Kernel) -> Result<()> {
        match &k.kind {
            KernelKind::MatMul { matmul, register } => {
                if let Some(ds) = self.template_matmul(gpu, g, k, *matmul, *register)? {
                    self.dispatches.extend(ds);
                    return Ok(());
                }
                self.generated(gpu, g, k)
            }
            KernelKind::LayerNorm { with_stats } => {
                let y = *k.outputs.last().expect("layer_norm writes y");
                let ins = g.node(y).inputs.clone();
                let Op::LayerNormStats { eps } = g.node(ins[1]).op else {
                    return Err(err!(Invariant, "layer_norm reads stats from a non-stats node"));
                };
                let d = *g.shape(y).last().unwrap_or(&1);
                let rows = g.shape(y).iter().product::<usize>() / d.max(1);
                // Without `with_stats` the stats are already in their buffer; recomputing them
                // into scratch gives the same numbers and keeps one forward kernel.
                if rows == 0 {
                    return Ok(()); // no rows: nothing to normalize
                }
                let ln = self.cache.layer_norm(gpu, d)?;
                let stats_scratch;
                let stats = if *with_stats {
                    self.buf(ins[1])?
                } else {
                    stats_scratch = self.scratch(gpu, rows * 2)?;
                    &stats_scratch
                };
                let fwd = LayerNormForward {
                    x: self.buf(ins[0])?,
                    weight: self.buf(ins[2])?,
                    bias: self.buf(ins[3])?,
                    y: self.buf(y)?,
                    stats,
                };
                let dispatch = ln.forward(gpu, rows, eps, &fwd)?;
                self.dispatches.push(dispatch);
                Ok(())
            }
            KernelKind::LayerNormStats => {
                let stats = k.outputs[0];
                let x = g.node(stats).inputs[0];
                let Op::LayerNormStats { eps } = g.node(stats).op else {
                    unreachable!("stats kernel")
                };
                let d = *g.shape(x).last().unwrap_or(&1);
                let rows = g.shape(x).iter().product::<usize>() / d.max(1);
                if rows == 0 {
                    return Ok(());
                }
                let ln = self.cache.layer_norm(gpu, d)?;
                let ones = gpu.upload_f32("layer_norm ones", &vec![1.0; d])?;
                let zeros = gpu.upload_f32("layer_norm zeros", &vec![0.0; d])?;
                let y = self.scratch(gpu, rows * d)?;
                let fwd = LayerNormForward {
                    x: self.buf(x)?,
                    weight: &ones,
                    bias: &zeros,
                    y: &y,
                    stats: self.buf(stats)?,
                };
                let mut dispatch = ln.forward(gpu, rows, eps, &fwd)?;
                dispatch.owned.extend([ones, zeros, y]);
                self.dispatches.push(dispatch);
                Ok(())
            }
            KernelKind::LayerNormGradInput { weight_grad } => {
                let dx = *k.outputs.last().expect("writes dx");
                let ins = g.node(dx).inputs.clone(); // x, stats, weight, dy
                self.ln_backward(gpu, g, &ins, Some(dx), *weight_grad)
            }
            KernelKind::LayerNormGradWeight => {
                let dwb = k.outputs[0];
                let i = g.node(dwb).inputs.clone(); // x, stats, dy
                let d = *g.shape(i[0]).last().unwrap_or(&1);
                let ones = gpu.upload_f32("layer_norm ones", &vec![1.0; d])?;
                let r = self.ln_backward_with(gpu, g, [i[0], i[1], i[2]], &ones, None, Some(dwb));
                if let Some(dp) = self.dispatches.last_mut() {
                    dp.owned.push(ones);
                }
                r
            }
            _ => self.generated(gpu, g, k),
        }
    }

    fn ln_backward(
        &mut self,
        gpu: &Gpu,
        g: &Graph,
        ins: &[NodeId],
        dx: Option<NodeId>,
        dwb: Option<NodeId>,
    ) -> Result<()> {
        let weight = self.buf(ins[2])?.clone();
        self.ln_backward_with(gpu, g, [ins[0], ins[1], ins[3]], &weight, dx, dwb)
    }

    /// LayerNorm backward over (x, stats, dy): dx into `dx`'s buffer and dweight/dbias into the
    /// two rows of `dwb`'s buffer, each into scratch when not wanted.
    fn ln_backward_with(
        &mut self,
        gpu: &Gpu,
        g: &Graph,
        [x, stats, dy]: [NodeId; 3],
        weight: &wgpu::Buffer,
        dx: Option<NodeId>,
        dwb: Option<NodeId>,
    ) -> Result<()> {
        let d = *g.shape(x).last().unwrap_or(&1);
        let rows = g.shape(x).iter().product::<usize>() / d.max(1);
        let ln = self.cache.layer_norm(gpu, d)?;
        let scratch = self.shared_scratch(gpu, ln.scratch_len(rows))?;
        let dx_buf = match dx {
            Some(id) => self.buf(id)?.clone(),
            None => self.scratch(gpu, rows * d)?,
        };
        let dwb_buf = match dwb {
            Some(id) => self.buf(id)?.clone(),
            None => self.scratch(gpu, 2 * d)?,
        };
        let bw = LayerNormBackward {
            x: self.buf(x)?,
            weight,
            stats: self.buf(stats)?,
            dy: self.buf(dy)?,
            dx: &dx_buf,
            dparams: &dwb_buf,
            scratch: &scratch,
            accumulate_dx: false,
            accumulate_params: false,
        };
        let [mut a, b] = ln.backward(gpu, rows, &bw)?;
        a.owned.push(scratch);
        self.dispatches.push(a);
        self.dispatches.push(b);
        Ok(())
    }

    fn scratch(&mut self, gpu: &Gpu, len: usize) -> Result<wgpu::Buffer> {
        self.scratch_bytes += len.max(1) as u64 * 4;
        gpu.storage("scratch", len.max(1))
    }

    /// Scratch that one kernel uses alone, within its own dispatches: every such kernel shares
    /// one buffer (dispatches run in order, so no two of them hold it at once). A larger need
    /// replaces it with one twice as large, so the bytes stay within twice the largest need.
    fn shared_scratch(&mut self, gpu: &Gpu, len: usize) -> Result<wgpu::Buffer> {
        if let Some(buf) = &self.shared {
            if buf.size() >= len.max(1) as u64 * 4 {
                return Ok(buf.clone());
            }
        }
        let grown = self.shared.as_ref().map_or(0, |b| b.size() as usize / 2);
        let buf = self.scratch(gpu, len.max(grown))?;
        self.shared = Some(buf.clone());
        Ok(buf)
    }

    /// A generated kernel: compile its module and bind its buffers (and `meta`).
    fn generated(&mut self, gpu: &Gpu, g: &Graph, k: &Kernel) -> Result<()> {
        let src = generate(g, &self.plan, k);
        if src.workgroups == 0 {
            return Ok(()); // nothing to compute or check (a zero-size value)
        }
        let pipeline = self.cache.pipeline(gpu, &src.label, &src.wgsl)?;
        let mut bound: Vec<&wgpu::Buffer> =
            src.bindings.iter().map(|&(b, _)| &self.buffers[b]).collect();
        if src.status.is_some() {
            bound.push(self.status.as_ref().ok_or_else(|| {
                err!(Invariant, "kernel `{}` uses a status buffer the plan lacks", src.label)
            })?);
        }
        if src.uses_meta {
            bound.push(&self.meta);
        }
        let bind_group = gpu.bind_group(&src.label, &pipeline, &bound)?;
        let workgroups = gpu.dispatch_dims(src.workgroups);
        self.dispatches.push(Dispatch {
            label: src.label,
            pipeline,
            bind_group,
            workgroups,
            owned: Vec::new(),
        });
        Ok(())
    }

    /// The matmul template with a generated epilogue, when the operands can be described by
    /// strides (contiguous buffers, optionally transposed, batch equal or broadcast).
    fn template_matmul(
        &mut self,
        gpu: &Gpu,
        g: &Graph,
        k: &Kernel,
        mm: NodeId,
        register: NodeId,
    ) -> Result<Option<Vec<Dispatch>>> {
        let out = *k.outputs.last().expect("matmul writes a value");
        let Some(epilogue) = matmul_epilogue(g, &self.plan, k, register) else {
            return Ok(None);
        };
        let node = g.node(mm);
        let (sa, sb, so) = (g.shape(node.inputs[0]), g.shape(node.inputs[1]), &node.shape);
        let r = so.len();
        let (m, n, kk) = (so[r - 2], so[r - 1], sa[sa.len() - 1]);
        let batch: usize = so[..r - 2].iter().product();
        if m * n * batch == 0 {
            return Ok(Some(Vec::new())); // an empty product: nothing to write
        }
        let fits = |v: usize| u32::try_from(v).is_ok();
        if ![m, n, kk, batch, m * n * batch].iter().all(|&v| fits(v)) {
            return Ok(None);
        }
        let (Some((a_src, a_op)), Some((b_src, b_op))) = (
            operand(g, &self.plan, node.inputs[0], sa, batch, m, kk),
            operand(g, &self.plan, node.inputs[1], sb, batch, kk, n),
        ) else {
            return Ok(None);
        };
        let MatmulEpilogue { decls, body, extra } = epilogue;
        let spec = MatmulSpec {
            batch: batch as u32,
            m: m as u32,
            n: n as u32,
            k: kk as u32,
            a: a_op,
            b: b_op,
            c: Operand::row_major(m as u32, n as u32),
            alpha: 1.0,
            beta: 0.0,
        };
        if let Some(splits) = split_k(&spec) {
            return self
                .split_k_matmul(gpu, k, out, spec, splits, (a_src, b_src), (&decls, &body, &extra))
                .map(Some);
        }
        let tile = MatmulTile::choose(&spec);
        let (bm, bn, ..) = tile.shape();
        let max = gpu.limits.max_compute_workgroups_per_dimension;
        if n.div_ceil(bn as usize) > max as usize
            || m.div_ceil(bm as usize) > max as usize
            || batch > max as usize
        {
            return Ok(None); // the generated kernel splits any grid
        }
        let key = format!("{tile:?}\n{decls}\n{body}");
        let kernel = match self.cache.matmul.get(&key) {
            Some(m) => m.clone(),
            None => {
                let m = Matmul::with_epilogue(gpu, tile, &decls, &body)?;
                self.cache.matmul.insert(key, m.clone());
                m
            }
        };
        let extra_bufs: Vec<&wgpu::Buffer> = extra.iter().map(|&b| &self.buffers[b]).collect();
        let mut d = kernel.dispatch(
            gpu,
            &spec,
            self.buf(a_src)?,
            self.buf(b_src)?,
            self.buf(out)?,
            &extra_bufs,
        )?;
        d.label = format!("{} #{}", k.kind.name(), out.index());
        Ok(Some(vec![d]))
    }

    /// A product too small in M×N to fill the GPU but long in K, as `splits` partial products
    /// over slices of K (one batched matmul into scratch), then one kernel that sums the slices
    /// and applies the epilogue.
    #[allow(clippy::too_many_arguments)]
    fn split_k_matmul(
        &mut self,
        gpu: &Gpu,
        k: &Kernel,
        out: NodeId,
        spec: MatmulSpec,
        splits: u32,
        (a_src, b_src): (NodeId, NodeId),
        (decls, body, extra): (&str, &str, &[usize]),
    ) -> Result<Vec<Dispatch>> {
        let (m, n) = (spec.m, spec.n);
        let chunk = spec.k / splits;
        let mn = m as usize * n as usize;
        let parts = self.shared_scratch(gpu, mn * splits as usize)?;
        let partial = MatmulSpec {
            batch: splits,
            k: chunk,
            a: Operand { batch_stride: chunk * spec.a.col_stride, ..spec.a },
            b: Operand { batch_stride: chunk * spec.b.row_stride, ..spec.b },
            c: Operand::row_major(m, n),
            ..spec
        };
        let tile = MatmulTile::choose(&partial);
        let key = format!("{tile:?}\nplain");
        let plain = match self.cache.matmul.get(&key) {
            Some(p) => p.clone(),
            None => {
                let p = Matmul::new(gpu, tile)?;
                self.cache.matmul.insert(key, p.clone());
                p
            }
        };
        let mut first =
            plain.dispatch(gpu, &partial, self.buf(a_src)?, self.buf(b_src)?, &parts, &[])?;
        first.label = format!("matmul #{} split-k {splits}", out.index());
        let wgsl = format!(
            "alias scalar = f32;\n@group(0) @binding(0) var<storage, read> parts: array<f32>;\n@group(0) @binding(1) var<storage, read_write> c: array<f32>;\n{decls}\nfn epilogue(v: scalar, batch: u32, i: u32, j: u32) -> scalar {{\n{body}\n}}\n@compute @workgroup_size(256)\nfn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{\n    let idx = (wid.x + wid.y * nwg.x) * 256u + lid;\n    if (idx >= {mn}u) {{ return; }}\n    var v = 0.0;\n    for (var s = 0u; s < {splits}u; s++) {{ v += parts[s * {mn}u + idx]; }}\n    c[idx] = epilogue(v, 0u, idx / {n}u, idx % {n}u);\n}}\n"
        );
        let pipeline = self.cache.pipeline(gpu, "split-k sum", &wgsl)?;
        let mut bound: Vec<(u32, &wgpu::Buffer)> = vec![(0, &parts), (1, self.buf(out)?)];
        for (i, &b) in extra.iter().enumerate() {
            bound.push((4 + i as u32, &self.buffers[b]));
        }
        let bind_group = gpu.bind_group_at("split-k sum", &pipeline, &bound)?;
        let second = Dispatch {
            label: format!("{} #{} split-k sum", k.kind.name(), out.index()),
            pipeline,
            bind_group,
            workgroups: gpu.dispatch_dims((mn as u32).div_ceil(256)),
            owned: vec![parts],
        };
        Ok(vec![first, second])
    }

    /// Run one step: write `feeds` and the step counter, encode every dispatch (optionally
    /// after filling every reused buffer with NaN), apply the updates, submit once, and read
    /// back `read`.
    pub fn step(
        &self,
        gpu: &Gpu,
        g: &Graph,
        feeds: &[(NodeId, &Tensor)],
        step: u64,
        read: &[NodeId],
        poison: bool,
    ) -> Result<Vec<Tensor>> {
        for (id, t) in feeds {
            let want = g.shape(*id);
            if t.shape() != want || t.dtype() != g.dtype(*id) {
                return Err(err!(
                    Shape,
                    "input node {} must be {}{}, got {}{}",
                    id.index(),
                    g.dtype(*id),
                    fmt_shape(want),
                    t.dtype(),
                    fmt_shape(t.shape())
                ));
            }
            if let Some(buf) = self.buffer_of(*id) {
                gpu.write(buf, 0, &t.to_le_bytes())?;
            }
        }
        let mut meta = [0u8; 16];
        meta[..4].copy_from_slice(&(step as u32).to_le_bytes());
        gpu.write(&self.meta, 0, &meta)?;
        if poison {
            for (b, info) in self.plan.buffers.iter().enumerate() {
                if !info.pinned {
                    gpu.write(&self.buffers[b], 0, &vec![0xff; info.bytes as usize])?;
                }
            }
        }
        if let Some(status) = &self.status {
            let mut words = vec![u32::MAX; status_words(&self.plan)];
            words[0] = 0;
            gpu.write(status, 0, bytemuck::cast_slice(&words))?;
        }
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        let all: Vec<&Dispatch> = self.dispatches.iter().collect();
        gpu.encode(&mut enc, &all);
        for &(from, to, bytes) in &self.copies {
            enc.copy_buffer_to_buffer(&self.buffers[from], 0, &self.buffers[to], 0, bytes);
        }
        let mut parts = Vec::with_capacity(read.len() + 1);
        for &id in read {
            parts.push((self.buf(id)?, 0..g.shape(id).iter().product::<usize>()));
        }
        if let Some(status) = &self.status {
            parts.push((status, 0..status_words(&self.plan)));
        }
        let readback = gpu.encode_readback(&mut enc, &parts)?;
        gpu.submit(enc)?;
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
        let words: Vec<u32> =
            gpu.read_i32_range(self.buf(id)?, 0..n)?.into_iter().map(|w| w as u32).collect();
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

/// Slices of K for a product whose M×N tiles cannot fill a large GPU (fewer than two 64×64
/// workgroups per multiprocessor of an H200) but whose K is long: a power of two that divides K,
/// keeps slices of at least 128, and brings the workgroups to about four per multiprocessor.
fn split_k(spec: &MatmulSpec) -> Option<u32> {
    let tiles = spec.m.div_ceil(64) * spec.n.div_ceil(64);
    if spec.batch != 1 || tiles >= 264 || spec.k < 1024 {
        return None;
    }
    let mut s = 1;
    while s < 32 && tiles * s * 2 <= 528 && spec.k.is_multiple_of(s * 2) && spec.k / (s * 2) >= 128
    {
        s *= 2;
    }
    (s > 1).then_some(s)
}

/// Describe matmul operand `id` (logical `[batch.., rows, cols]`) as strides over a buffer:
/// a materialized value, or a transpose of the last two axes of one. Batch dims must equal the
/// output's or be all 1 (broadcast).
fn operand(
    g: &Graph,
    plan: &Plan,
    id: NodeId,
    shape: &[usize],
    batch: usize,
    rows: usize,
    cols: usize,
) -> Option<(NodeId, Operand)> {
    let own_batch: usize = shape[..shape.len() - 2].iter().product();
    let broadcast = own_batch == 1 && batch != 1;
    if own_batch != batch && !broadcast {
        return None;
    }
    let (src, op) = if plan.value_of(id).is_some() {
        (id, Operand::row_major(rows as u32, cols as u32))
    } else {
        let node = g.node(id);
        let Op::Permute { perm } = &node.op else {
            return None;
        };
        let r = perm.len();
        let swaps_last = perm[..r - 2].iter().enumerate().all(|(i, &p)| i == p)
            && perm[r - 2] == r - 1
            && perm[r - 1] == r - 2;
        let src = node.inputs[0];
        if !swaps_last || plan.value_of(src).is_none() {
            return None;
        }
        (src, Operand::transposed(rows as u32, cols as u32))
    };
    Some((src, if broadcast { op.broadcast() } else { op }))
}
