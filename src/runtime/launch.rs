//! Programs to dispatches: the one place the runtime turns codegen's [`Program`]s into
//! pipelines, bind groups and workgroup grids, without knowing what any program computes.

use super::device::{Dispatch, Gpu};
use crate::codegen::{Grid, Program, Resource, ShaderChecks};
use crate::err;
use crate::error::Result;
use std::collections::HashMap;

/// The buffers a program's [`Resource`]s name.
#[derive(Default)]
pub struct Resources<'a> {
    /// `Resource::Buffer(i)` is `buffers[i]`.
    pub buffers: Vec<&'a wgpu::Buffer>,
    pub status: Option<&'a wgpu::Buffer>,
    pub meta: Option<&'a wgpu::Buffer>,
    /// `Resource::Scratch { slot }` is `scratch[slot]`.
    pub scratch: Vec<&'a wgpu::Buffer>,
}

/// Builds dispatches, compiling each distinct module once: kernels of identical layers
/// generate identical WGSL (sizes are literals, bindings are numbered by use), so a model of
/// twelve layers compiles the pipelines of one.
#[derive(Default)]
pub struct Launcher {
    pipelines: HashMap<(String, &'static str, ShaderChecks), wgpu::ComputePipeline>,
    filled: HashMap<(u32, usize), wgpu::Buffer>,
}

impl Launcher {
    /// The dispatch of `p` over `res`. An error when a buffer is missing or holds fewer
    /// elements than a binding needs, or a fixed grid exceeds the device's limit.
    pub fn prepare(&mut self, gpu: &Gpu, p: &Program, res: &Resources) -> Result<Dispatch> {
        let key = (p.wgsl.clone(), p.entry, p.checks);
        let pipeline = match self.pipelines.get(&key) {
            Some(pl) => pl.clone(),
            None => {
                let pl = gpu.pipeline_with(&p.label, &p.wgsl, p.entry, p.checks)?;
                self.pipelines.insert(key, pl.clone());
                pl
            }
        };
        let missing =
            |what: String| err!(Invariant, "`{}` binds {what}, which is missing", p.label);
        let mut owned = Vec::new();
        for b in &p.bindings {
            let buf = match &b.resource {
                Resource::Uniform(bytes) => gpu.uniform(&p.label, bytes)?,
                Resource::Filled { value, words } => {
                    match self.filled.get(&(value.to_bits(), *words)) {
                        Some(buf) => buf.clone(),
                        None => {
                            let buf = gpu.upload_f32(&p.label, &vec![*value; (*words).max(1)])?;
                            self.filled.insert((value.to_bits(), *words), buf.clone());
                            buf
                        }
                    }
                }
                _ => continue,
            };
            owned.push(buf);
        }
        let mut own = owned.iter();
        let mut bound = Vec::with_capacity(p.bindings.len());
        for b in &p.bindings {
            let buf = match &b.resource {
                Resource::Buffer(i) => res.buffers.get(*i).copied(),
                Resource::Status => res.status,
                Resource::Meta => res.meta,
                Resource::Scratch { slot } => res.scratch.get(*slot).copied(),
                Resource::Uniform(_) | Resource::Filled { .. } => own.next(),
            };
            let buf = buf.ok_or_else(|| missing(format!("{:?}", b.resource)))?;
            let have = buf.size() / 4;
            if b.words > have {
                return Err(err!(
                    Device,
                    "`{}`: `{}` needs {} elements, its buffer holds {have}",
                    p.label,
                    b.name,
                    b.words
                ));
            }
            bound.push((b.at, buf));
        }
        let bind_group = gpu.bind_group_at(&p.label, &pipeline, &bound)?;
        let workgroups = match p.grid {
            Grid::Linear(n) => gpu.dispatch_dims(n),
            Grid::Fixed(grid) => {
                gpu.check_grid(&p.label, grid)?;
                grid
            }
        };
        Ok(Dispatch { label: p.label.clone(), pipeline, bind_group, workgroups, owned })
    }
}

/// The dispatch of a stand-alone program over `buffers` (its `Resource::Buffer(i)`) and
/// `scratch`: for kernel tests and benchmarks.
pub fn prepare(
    gpu: &Gpu,
    p: &Program,
    buffers: &[&wgpu::Buffer],
    scratch: &[&wgpu::Buffer],
) -> Result<Dispatch> {
    let res =
        Resources { buffers: buffers.to_vec(), scratch: scratch.to_vec(), ..Resources::default() };
    Launcher::default().prepare(gpu, p, &res)
}
