//! The GPU as a [`Backend`]: a graph's persistent values live in device buffers, and each set of
//! wanted values (a training step, an evaluation) is a [`GpuPlan`] compiled once and reused.

use super::device::Gpu;
use super::exec::GpuPlan;
use crate::backend::{Backend, GradSync, RunOptions};
use crate::codegen::MatmulOptions;
use crate::err;
use crate::error::Result;
use crate::graph::init::init_values;
use crate::graph::{Graph, NodeId, Op};
use crate::plan::arena::host_arenas;
use crate::plan::{plan, Limits, PlanOptions};
use crate::tensor::{fmt_shape, Tensor};
use std::collections::HashMap;

/// A graph placed on a GPU.
pub struct GpuBackend {
    gpu: &'static Gpu,
    graph: Graph,
    /// Buffers of inputs, parameters and state, shared by every plan of this graph: a host
    /// arena (`plan::arena`) has one buffer, and each of its members is a range of it.
    persistent: HashMap<NodeId, wgpu::Buffer>,
    /// The members of host arenas: (arena node, offset in bytes).
    placed: HashMap<NodeId, (NodeId, u64)>,
    /// Compiled plans by (wanted values, training).
    plans: HashMap<(Vec<NodeId>, bool), GpuPlan>,
    options: PlanOptions,
    /// Fill reused buffers with NaN before every step (for tests of the plan's reuse).
    pub poison: bool,
    /// How codegen chooses matmul kernels for the plans compiled from now on.
    pub matmul: MatmulOptions,
    /// Elements a workgroup of a reduction's first stage takes ([`Target::reduce_chunk`]), for
    /// the plans compiled from now on.
    ///
    /// [`Target::reduce_chunk`]: crate::codegen::Target::reduce_chunk
    pub reduce_chunk: u32,
    /// Merge adjacent independent dispatches ([`Target::merge_dispatches`]) in the plans
    /// compiled from now on (`RUMUS_MERGE_DISPATCHES`, on by default).
    ///
    /// [`Target::merge_dispatches`]: crate::codegen::Target::merge_dispatches
    pub merge_dispatches: bool,
    /// Data-parallel training: average the gradients across ranks in every training step.
    pub sync: Option<GradSync>,
}

impl GpuBackend {
    /// Create the persistent buffers and fill parameters and state with their initial values.
    pub fn new(
        gpu: &'static Gpu,
        graph: Graph,
        seed: u64,
        options: PlanOptions,
    ) -> Result<GpuBackend> {
        let _turn = gpu.turn();
        // The device's limits, tightened by any the caller gives.
        let device = Limits::of(&gpu.limits);
        let limits = options.limits.map_or(device, |l| l.within(device));
        let options = PlanOptions { limits: Some(limits), ..options };
        let mut persistent = HashMap::new();
        let mut placed = HashMap::new();
        for a in host_arenas(&graph) {
            let len = graph.shape(a.node)[0];
            let bytes = (len as u64).saturating_mul(4);
            gpu.check_buffer_size("a parameter or state arena", bytes, super::device::STORAGE)?;
            let mut values = vec![0f32; len];
            for &(m, at) in &a.members {
                let node = graph.node(m);
                if let Op::Parameter { name, init } | Op::State { name, init } = &node.op {
                    let init = init_values(init, &node.shape, seed, name);
                    values[at..at + init.len()].copy_from_slice(&init);
                }
                placed.insert(m, (a.node, at as u64 * 4));
            }
            persistent.insert(a.node, gpu.upload_f32("arena", &values)?);
        }
        for (id, node) in graph.nodes() {
            if !node.op.is_host_value() || placed.contains_key(&id) {
                continue;
            }
            let len: usize = node.shape.iter().product();
            // Refuse what the device cannot hold before building initial values on the host.
            let bytes = (len as u64).saturating_mul(4);
            let label = match &node.op {
                Op::Input { name } | Op::Parameter { name, .. } | Op::State { name, .. } => name,
                _ => continue,
            };
            gpu.check_buffer_size(label, bytes, super::device::STORAGE)
                .map_err(|e| e.at(node.span))?;
            let buf = match &node.op {
                Op::Input { name } => gpu.storage(&format!("input {name}"), len.max(1))?,
                Op::Parameter { name, init } | Op::State { name, init } => {
                    gpu.upload_f32(name, &init_values(init, &node.shape, seed, name))?
                }
                _ => continue,
            };
            persistent.insert(id, buf);
        }
        Ok(GpuBackend {
            gpu,
            graph,
            persistent,
            placed,
            plans: HashMap::new(),
            options,
            poison: false,
            matmul: MatmulOptions::from_env()?,
            reduce_chunk: crate::codegen::REDUCE_CHUNK,
            merge_dispatches: crate::codegen::merge::from_env()?,
            sync: None,
        })
    }

    /// The plan for `want` (compiled on first use).
    pub fn plan_for(&mut self, want: &[NodeId], training: bool) -> Result<&GpuPlan> {
        let _turn = self.gpu.turn();
        self.compiled(want, training)
    }

    /// [`GpuBackend::plan_for`] under the caller's turn at the device.
    fn compiled(&mut self, want: &[NodeId], training: bool) -> Result<&GpuPlan> {
        let key = (want.to_vec(), training);
        if !self.plans.contains_key(&key) {
            let converts = self.gpu.target(self.matmul).converts_operands();
            let options = PlanOptions {
                matmul_prologues: self.options.matmul_prologues || converts,
                ..self.options
            };
            let p = plan(&self.graph, want, training, options)?;
            let target = crate::codegen::Target {
                reduce_chunk: self.reduce_chunk,
                merge_dispatches: self.merge_dispatches,
                ..self.gpu.target(self.matmul)
            };
            let sync = self.sync.as_ref().filter(|_| training);
            let compiled = GpuPlan::new(self.gpu, &self.graph, p, &self.persistent, target, sync)?;
            self.plans.insert(key.clone(), compiled);
        }
        Ok(&self.plans[&key])
    }

    /// The buffer of a persistent value and the offset in bytes it starts at.
    fn persistent_buffer(&self, id: NodeId) -> Result<(&wgpu::Buffer, u64)> {
        let (owner, offset) = self.placed.get(&id).copied().unwrap_or((id, 0));
        let buf = self.persistent.get(&owner);
        let buf = buf.ok_or_else(|| err!(Invariant, "node {} is not persistent", id.index()))?;
        Ok((buf, offset))
    }
}

impl Drop for GpuBackend {
    /// Plans and buffers are freed under a turn at the device ([`Gpu::turn`]): freeing them
    /// calls into it too.
    fn drop(&mut self) {
        let _turn = self.gpu.turn();
        self.plans.clear();
        self.persistent.clear();
    }
}

impl Backend for GpuBackend {
    fn device_name(&self) -> String {
        self.gpu.describe()
    }

    fn run(
        &mut self,
        feeds: &[(NodeId, &Tensor)],
        want: &[NodeId],
        opts: RunOptions,
    ) -> Result<Vec<Tensor>> {
        let (gpu, poison) = (self.gpu, self.poison);
        let _turn = gpu.turn();
        self.compiled(want, opts.training)?;
        let p = &self.plans[&(want.to_vec(), opts.training)];
        p.step(gpu, &self.graph, feeds, opts, want, poison)
    }

    fn run_micro_batch(
        &mut self,
        feeds: &[(NodeId, &Tensor)],
        want: &[NodeId],
        step: u64,
    ) -> Result<Vec<Tensor>> {
        let (gpu, poison) = (self.gpu, self.poison);
        let _turn = gpu.turn();
        self.compiled(want, true)?;
        let p = &self.plans[&(want.to_vec(), true)];
        p.micro_batch(gpu, &self.graph, feeds, step, want, poison)
    }

    fn read(&self, id: NodeId) -> Result<Tensor> {
        crate::backend::persistent_node(&self.graph, id)?;
        let _turn = self.gpu.turn();
        let (buf, offset) = self.persistent_buffer(id)?;
        let n: usize = self.graph.shape(id).iter().product();
        let start = (offset / 4) as usize;
        Tensor::f32(self.graph.shape(id), self.gpu.read_f32_range(buf, start..start + n)?)
    }

    fn write(&mut self, id: NodeId, value: &Tensor) -> Result<()> {
        crate::backend::persistent_node(&self.graph, id)?;
        let shape = self.graph.shape(id);
        if value.shape() != shape {
            return Err(err!(
                Shape,
                "value of node {} must be {}, got {}",
                id.index(),
                fmt_shape(shape),
                fmt_shape(value.shape())
            ));
        }
        if value.as_f32().is_none() {
            // As the CPU backend: the bytes of an i32 tensor would land as f32 bit patterns.
            return Err(err!(Shape, "persistent values are f32, got {}", value.dtype()));
        }
        let _turn = self.gpu.turn();
        let (buf, offset) = self.persistent_buffer(id)?;
        self.gpu.write(buf, offset, &value.to_le_bytes())
    }

    fn plan_report(&self) -> String {
        let mut out = format!("device {}\n", self.gpu.describe());
        for ((want, training), p) in &self.plans {
            let mut r = crate::plan::report::PlanReport::new(
                &self.graph,
                &p.plan,
                p.n_dispatches(),
                p.scratch_bytes,
            );
            r.micro_dispatches = p.n_micro_dispatches();
            out.push_str(&format!(
                "plan for {} value(s){}:\n{}",
                want.len(),
                if *training { ", training" } else { "" },
                r.text()
            ));
            if let Some(ex) = &p.exchange {
                out.push_str(&format!("gradients averaged across ranks: {}\n", ex.kind()));
            }
        }
        out
    }
}
