//! Programs to dispatches: the one place the runtime turns codegen's [`Program`]s into
//! pipelines, bind groups and workgroup grids, without knowing what any program computes.

use super::device::{Dispatch, Gpu};
use crate::codegen::{Grid, Program, Resource, ShaderChecks};
use crate::err;
use crate::error::Result;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// The key a compiled pipeline is found by: the module's text, its entry and its checks.
type PipelineKey = (String, &'static str, ShaderChecks);

fn key(p: &Program) -> PipelineKey {
    (p.wgsl.clone(), p.entry, p.checks)
}

/// A range of a buffer, bound at its offset (a plan buffer may be a range of another).
#[derive(Clone, Copy)]
pub struct Range<'a> {
    pub buffer: &'a wgpu::Buffer,
    /// Bytes from the buffer's start (a multiple of the device's storage offset alignment).
    pub offset: u64,
    pub bytes: u64,
}

impl<'a> Range<'a> {
    /// The whole buffer.
    pub fn whole(buffer: &'a wgpu::Buffer) -> Range<'a> {
        Range { buffer, offset: 0, bytes: buffer.size() }
    }
}

/// The buffers a program's [`Resource`]s name.
#[derive(Default)]
pub struct Resources<'a> {
    /// `Resource::Buffer(i)` is `buffers[i]`.
    pub buffers: Vec<Range<'a>>,
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
    pipelines: HashMap<PipelineKey, wgpu::ComputePipeline>,
    filled: HashMap<(u32, usize), wgpu::Buffer>,
}

impl Launcher {
    /// Compile the distinct modules among `programs` not compiled yet, on several threads: the
    /// driver takes up to a second for each large kernel, and a plan has dozens. Mesa's OpenGL
    /// backend shares one context between threads, so there they compile in turn. Up to 16
    /// threads: on the H200's 16-core host a cold gpt-medium compile took 1.36–1.39 s against
    /// 1.56–1.71 s with 8 (`highest`; BENCHMARKS.md). An error is the first failing program's,
    /// in the order given.
    pub fn compile_all<'p>(
        &mut self,
        gpu: &Gpu,
        programs: impl IntoIterator<Item = &'p Program>,
    ) -> Result<()> {
        let mut seen = HashSet::new();
        let todo: Vec<(&Program, PipelineKey)> = programs
            .into_iter()
            .map(|p| (p, key(p)))
            .filter(|(_, k)| !self.pipelines.contains_key(k) && seen.insert(k.clone()))
            .collect();
        let threads = match gpu.info.backend {
            wgpu::Backend::Gl => 1,
            _ => std::thread::available_parallelism().map_or(1, |n| n.get().min(16)),
        };
        let compiled: Vec<Mutex<Option<Result<wgpu::ComputePipeline>>>> =
            todo.iter().map(|_| Mutex::new(None)).collect();
        let next = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..threads.min(todo.len()) {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some((p, _)) = todo.get(i) else { break };
                    let pipeline = gpu.pipeline_with(&p.label, &p.wgsl, p.entry, p.checks);
                    *compiled[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(pipeline);
                });
            }
        });
        let compiled_any = !todo.is_empty();
        for ((p, k), slot) in todo.into_iter().zip(compiled) {
            let pipeline = slot.into_inner().unwrap_or_else(|e| e.into_inner());
            let pipeline = pipeline.ok_or_else(|| {
                err!(Invariant, "pipeline `{}` was not compiled by any thread", p.label)
            })??;
            self.pipelines.insert(k, pipeline);
        }
        if compiled_any {
            gpu.save_pipeline_cache();
        }
        Ok(())
    }

    /// The dispatch of `p` over `res`. An error when a buffer is missing or holds fewer
    /// elements than a binding needs, or a fixed grid exceeds the device's limit.
    pub fn prepare(&mut self, gpu: &Gpu, p: &Program, res: &Resources) -> Result<Dispatch> {
        let pipeline = match self.pipelines.get(&key(p)) {
            Some(pl) => pl.clone(),
            None => {
                let pl = gpu.pipeline_with(&p.label, &p.wgsl, p.entry, p.checks)?;
                self.pipelines.insert(key(p), pl.clone());
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
                Resource::Status => res.status.map(Range::whole),
                Resource::Meta => res.meta.map(Range::whole),
                Resource::Scratch { slot } => res.scratch.get(*slot).copied().map(Range::whole),
                Resource::Uniform(_) | Resource::Filled { .. } => own.next().map(Range::whole),
            };
            let buf = buf.ok_or_else(|| missing(format!("{:?}", b.resource)))?;
            let have = buf.bytes / 4;
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
        let bind_group = bind_group(gpu, &p.label, &pipeline, &bound)?;
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

/// A bind group of group 0 of `pipeline` binding each range at its binding.
fn bind_group(
    gpu: &Gpu,
    label: &str,
    pipeline: &wgpu::ComputePipeline,
    bound: &[(u32, Range)],
) -> Result<wgpu::BindGroup> {
    let entries: Vec<wgpu::BindGroupEntry> = bound
        .iter()
        .map(|&(binding, r)| wgpu::BindGroupEntry {
            binding,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: r.buffer,
                offset: r.offset,
                size: std::num::NonZeroU64::new(r.bytes),
            }),
        })
        .collect();
    gpu.scoped(&format!("cannot bind buffers of `{label}`"), || {
        let layout = pipeline.get_bind_group_layout(0);
        gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(label),
            layout: &layout,
            entries: &entries,
        })
    })
}

/// The dispatch of a stand-alone program over `buffers` (its `Resource::Buffer(i)`) and
/// `scratch`: for kernel tests and benchmarks.
pub fn prepare(
    gpu: &Gpu,
    p: &Program,
    buffers: &[&wgpu::Buffer],
    scratch: &[&wgpu::Buffer],
) -> Result<Dispatch> {
    let buffers = buffers.iter().map(|&b| Range::whole(b)).collect();
    let res = Resources { buffers, scratch: scratch.to_vec(), ..Resources::default() };
    Launcher::default().prepare(gpu, p, &res)
}
