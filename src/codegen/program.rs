//! [`Program`]: what codegen hands the runtime for one dispatch of any kernel kind.
//!
//! A program is complete WGSL (generated, or a template from `shaders/` with its placeholders
//! filled), the entry point, the resources bound at each binding, the workgroup grid and how
//! the shader is compiled. The runtime turns it into a pipeline (shared by programs of
//! identical source), a bind group and a dispatch, knowing nothing of what the kernel computes.
//! A new kernel kind is a new function in codegen returning programs.

use super::loops::{Loops, SOFTWARE_LOOP_LIMIT};
use super::matmul::{MatmulTile, FP32_TILES};
use super::matmul_coop::CoopTile;
use super::MatmulPrecision;
use crate::err;
use crate::error::{env_text, Result};

/// One compute dispatch.
#[derive(Clone, Debug, PartialEq)]
pub struct Program {
    /// Label of the dispatch (the kernel kind first: profiles group dispatches by it).
    pub label: String,
    /// The whole module.
    pub wgsl: String,
    /// The entry point in `wgsl`.
    pub entry: &'static str,
    /// Threads per workgroup (the entry point's `@workgroup_size`, for reports).
    pub workgroup_size: u32,
    /// What each `@binding` of group 0 holds, in binding order.
    pub bindings: Vec<Binding>,
    pub grid: Grid,
    pub checks: ShaderChecks,
}

/// What a binding of a program holds.
#[derive(Clone, Debug, PartialEq)]
pub struct Binding {
    /// `@binding(at)` of group 0.
    pub at: u32,
    /// The WGSL variable bound (for reports and error messages).
    pub name: String,
    pub resource: Resource,
    /// Elements (4-byte words) the program may touch: a buffer bound here must hold at least
    /// this many (checked by the runtime, an error otherwise). 0: nothing to check.
    pub words: u64,
}

/// Where the buffer of a binding comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum Resource {
    /// Buffer `i` of the buffers the program runs over: the plan's buffers, or those the
    /// caller passes to a stand-alone program.
    Buffer(usize),
    /// The plan's status buffer (`codegen::wgsl` says what its words mean).
    Status,
    /// The plan's `meta` uniform: the step counter, for dropout.
    Meta,
    /// Scratch slot `slot`: a buffer used only within the dispatches of one kernel, shared by
    /// every kernel of the plan (each slot sized for the largest need), so its contents at the
    /// start of a kernel are unspecified. A kernel that needs two scratch buffers at once uses
    /// two slots.
    Scratch { slot: usize },
    /// A uniform block of these bytes, made for this dispatch.
    Uniform(Vec<u8>),
    /// A read-only buffer of `words` copies of `value`, made once per plan.
    Filled { value: f32, words: usize },
}

/// The workgroups a program launches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grid {
    /// `n` workgroups numbered linearly: the runtime spreads them over x, y (and z) when `n`
    /// exceeds the per-axis limit, and the kernel recovers `wid.x + wid.y * nwg.x` (ignoring
    /// ids from `n` on).
    Linear(u32),
    /// Exactly this grid (the kernel reads each axis); more than the device allows per axis is
    /// an error.
    Fixed([u32; 3]),
}

/// naga's runtime checks, per program (`wgpu::ShaderRuntimeChecks`). Both on unless a kernel is
/// known to stay in bounds and to terminate: some kernels are much faster without the loop
/// guard (a shared-memory matmul), some slower.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ShaderChecks {
    /// Clamp or discard out-of-bounds accesses.
    pub bounds: bool,
    /// Bound every loop's iterations (naga's loop guard).
    pub loop_bounding: bool,
}

impl ShaderChecks {
    /// Every check on: what WebGPU guarantees by default.
    pub const ALL: ShaderChecks = ShaderChecks { bounds: true, loop_bounding: true };
}

/// What [`super::compile`] needs to know of the device, and the matmul choices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target {
    /// Workgroups per grid axis (`max_compute_workgroups_per_dimension`).
    pub max_workgroups_per_dimension: u32,
    /// Bytes of workgroup memory a kernel may declare (`max_compute_workgroup_storage_size`).
    pub max_workgroup_bytes: u32,
    /// Threads per workgroup (`max_compute_invocations_per_workgroup`).
    pub max_invocations: u32,
    /// Storage buffers a kernel may bind (`max_storage_buffers_per_shader_stage`).
    pub max_storage_buffers: u32,
    /// The subgroup size of an adapter with 16x16x16 f16 x f16 -> f32 cooperative matrices
    /// (which the `high` and `medium` kernels need); `None` without them.
    pub cooperative: Option<u32>,
    pub matmul: MatmulOptions,
    /// Elements (at least) that one workgroup of a reduction's first stage sums: a reduction
    /// over more than this per output element runs in two stages, many workgroups writing
    /// partials and a second dispatch summing them in a fixed order. Tests lower it to run
    /// the two stages at sizes a software adapter computes quickly.
    pub reduce_chunk: u32,
    /// Loop iterations one invocation may run, all its loops together, before the adapter ends
    /// them early without a word ([`super::loops`]: Mesa's software adapters, 65,535); a
    /// program that could run more is refused. `None`: no such limit.
    pub max_loop_trips: Option<u64>,
    /// Run adjacent programs that touch no common memory as one dispatch ([`super::merge`]).
    /// Off for a plan whose gradients are exchanged between ranks (the exchange starts at
    /// kernel boundaries) and where `RUMUS_MERGE_DISPATCHES=0` says so.
    pub merge_dispatches: bool,
}

/// The default [`Target::reduce_chunk`]: 16 elements a thread of a 256-thread workgroup.
pub const REDUCE_CHUNK: u32 = 4096;

/// How codegen chooses matmul kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatmulOptions {
    /// A product runs on the generated SIMT kernel (`codegen/matmul_simt.rs`) when its grid
    /// has at least this many of that kernel's 128x256 blocks (and the device fits the
    /// kernel); smaller products fill a large GPU better with the template's smaller tiles.
    /// Tests lower it to run the SIMT kernel at sizes a software adapter computes quickly.
    pub simt_min_workgroups: u32,
    /// The precision of every product: `high` and `medium` run on cooperative matrices where
    /// the target has them (the session resolves the mode against the adapter first).
    pub precision: MatmulPrecision,
    /// The tile of the cooperative kernels, taken by every product it fits (`None`: the cost
    /// model chooses between each mode's tiles, or an fp32 kernel, per product;
    /// `RUMUS_MATMUL_COOP_TILE` sets it).
    pub coop_tile: Option<CoopTile>,
    /// Run the cooperative modes with their operations emulated in plain WGSL, on any adapter
    /// (for tests on adapters without cooperative matrices).
    pub emulate_coop: bool,
    /// Split K into this many slices wherever the product allows it (one product, K at least
    /// 512, slices of at least 128), instead of as the cost model chooses: for tests, which run
    /// the split-K path at sizes a software adapter computes quickly, and for trying splits
    /// on a GPU without a rebuild (`RUMUS_MATMUL_SPLIT_K`). `None` in use.
    pub split_k: Option<u32>,
    /// The fp32 kernel every product it fits runs on (`None`: chosen per product;
    /// `RUMUS_MATMUL_TILE` sets it, for trying kernels without a rebuild).
    pub fp32_tile: Option<MatmulTile>,
    /// The modes whose attention kernels run their block products on cooperative matrices
    /// (`codegen/attention/coop.rs`; the others run the fp32 kernels). By default `medium`'s,
    /// for heads of 64 or more: on the H200 its attention took 6.3 ms of gpt-medium's step
    /// against the fp32 kernels' 7.4, where `high`'s took 12.5 against 7.2 and gpt-small's
    /// (heads of 32) 0.79 against 0.71 (BENCHMARKS.md, "Attention on cooperative matrices");
    /// `RUMUS_ATTENTION_COOP` sets it.
    pub coop_attention: CoopAttention,
}

impl MatmulOptions {
    /// The choices measured on the H200: the SIMT kernel from 64 blocks (a 4096x768 product
    /// has 96; the template's tiles win on smaller and batched products).
    pub const DEFAULT: MatmulOptions = MatmulOptions {
        simt_min_workgroups: 64,
        precision: MatmulPrecision::Highest,
        coop_tile: None,
        emulate_coop: false,
        split_k: None,
        fp32_tile: None,
        coop_attention: CoopAttention::Medium,
    };
}

impl MatmulOptions {
    /// The defaults with the cooperative tile from `RUMUS_MATMUL_COOP_TILE` when it is set (for
    /// trying tiles without a rebuild; see [`CoopTile::parse`]), an error naming the variable
    /// when it does not parse or does not split for subgroups of 32 (NVIDIA's; compiling for a
    /// device whose threads or workgroup memory it exceeds is an error too,
    /// [`check_forced_coop_tile`](super::matmul::check_forced_coop_tile)); and an error when
    /// `RUMUS_MATMUL_TILE` names no fp32 kernel ([`FP32_TILES`](super::matmul::FP32_TILES)) or
    /// `RUMUS_MATMUL_SPLIT_K` is not 1, 2, 4, 8, 16 or 32 (the slices of K every product that
    /// allows them is then split into), or `RUMUS_ATTENTION_COOP` is none of `none`, `medium`
    /// and `all`.
    pub fn from_env() -> Result<MatmulOptions> {
        let coop_tile = match env_text("RUMUS_MATMUL_COOP_TILE")? {
            Some(v) if !v.trim().is_empty() => {
                let tile = CoopTile::parse(&v).and_then(|t| t.check(32).map(|()| t));
                Some(tile.map_err(|e| err!(Usage, "RUMUS_MATMUL_COOP_TILE: {}", e.message))?)
            }
            _ => None,
        };
        let fp32_tile = match env_text("RUMUS_MATMUL_TILE")? {
            Some(v) if !v.is_empty() => match FP32_TILES.iter().find(|&&(name, _)| name == v) {
                Some(&(_, tile)) => Some(tile),
                None => {
                    let names: Vec<_> = FP32_TILES.iter().map(|&(name, _)| name).collect();
                    let names = names.join(", ");
                    return Err(err!(Usage, "RUMUS_MATMUL_TILE: `{v}` is none of {names}"));
                }
            },
            _ => None,
        };
        let split_k = match env_text("RUMUS_MATMUL_SPLIT_K")? {
            Some(v) if !v.trim().is_empty() => match v.trim().parse::<u32>() {
                Ok(s) if s.is_power_of_two() && s <= 32 => Some(s),
                _ => {
                    return Err(err!(
                        Usage,
                        "RUMUS_MATMUL_SPLIT_K: `{v}` is not a number of slices of K: 1, 2, 4, 8, \
                         16 or 32"
                    ))
                }
            },
            _ => None,
        };
        let coop_attention = crate::error::env_choice(
            "RUMUS_ATTENTION_COOP",
            &[
                ("medium", CoopAttention::Medium),
                ("none", CoopAttention::None),
                ("all", CoopAttention::All),
            ],
        )?;
        Ok(MatmulOptions { coop_tile, fp32_tile, split_k, coop_attention, ..MatmulOptions::DEFAULT })
    }
}

/// Which cooperative modes run attention on cooperative matrices ([`MatmulOptions`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CoopAttention {
    /// None: the fp32 kernels in every mode.
    None,
    /// `medium`, heads of 64 or more (the default: where the H200 measured them faster).
    Medium,
    /// `high` and `medium`, every head dimension.
    All,
}

impl Default for MatmulOptions {
    fn default() -> MatmulOptions {
        MatmulOptions::DEFAULT
    }
}

impl Target {
    /// WebGPU's default limits, which every adapter meets.
    pub const WEBGPU_DEFAULT: Target = Target {
        max_workgroups_per_dimension: 65535,
        max_workgroup_bytes: 16384,
        max_invocations: 256,
        max_storage_buffers: 8,
        cooperative: None,
        matmul: MatmulOptions::DEFAULT,
        reduce_chunk: REDUCE_CHUNK,
        max_loop_trips: None,
        merge_dispatches: true,
    };

    /// An adapter with cooperative matrices, as the H200 reports itself (48 KiB of workgroup
    /// memory, 1024 threads per workgroup, subgroups of 32): what `rumus plan
    /// --matmul-precision high` plans for, since a machine without one cannot show it.
    pub const COOPERATIVE: Target = Target {
        max_workgroups_per_dimension: 65535,
        max_workgroup_bytes: 49152,
        max_invocations: 1024,
        max_storage_buffers: 64,
        cooperative: Some(32),
        matmul: MatmulOptions::DEFAULT,
        reduce_chunk: REDUCE_CHUNK,
        max_loop_trips: None,
        merge_dispatches: true,
    };

    /// The limits of a device; `cooperative` as in [`Target::cooperative`]; `software`: the
    /// adapter is a software one, whose loops end after [`SOFTWARE_LOOP_LIMIT`] iterations.
    pub fn of(
        limits: &wgpu::Limits,
        cooperative: Option<u32>,
        matmul: MatmulOptions,
        software: bool,
    ) -> Target {
        Target {
            max_workgroups_per_dimension: limits.max_compute_workgroups_per_dimension,
            max_workgroup_bytes: limits.max_compute_workgroup_storage_size,
            max_invocations: limits.max_compute_invocations_per_workgroup,
            max_storage_buffers: limits.max_storage_buffers_per_shader_stage,
            cooperative,
            matmul,
            reduce_chunk: REDUCE_CHUNK,
            max_loop_trips: software.then_some(SOFTWARE_LOOP_LIMIT),
            merge_dispatches: true,
        }
    }
}

/// The programs of a whole plan.
#[derive(Clone, Debug, Default)]
pub struct PlanPrograms {
    /// One entry per plan kernel, in plan order: its programs in dispatch order (none when it
    /// has nothing to compute, a zero-size value, or when its dispatches run inside an earlier
    /// kernel's merged ones, [`super::merge`]).
    pub kernels: Vec<KernelPrograms>,
    /// After the kernels, one guarded program per update that is not written in place, when the
    /// plan has a status buffer (nothing is committed once a check failed).
    pub commits: Vec<Program>,
    /// Without a status buffer: updates copied after the compute pass, as
    /// (from buffer, to buffer, bytes).
    pub copies: Vec<(usize, usize, u64)>,
    /// For each commit (with a status buffer) or copy (without), the index in the plan's
    /// updates of the update it applies.
    pub applies: Vec<usize>,
    /// Words of the status buffer (0: the plan has no checking kernel and no status buffer).
    pub status_words: usize,
    /// Words of each scratch slot: the largest any program binds.
    pub scratch_words: Vec<u64>,
}

/// The programs of one plan kernel, with what it computes (for listings).
#[derive(Clone, Debug, Default)]
pub struct KernelPrograms {
    /// The kernel kind.
    pub kind: &'static str,
    /// The ops it computes, in arena order.
    pub ops: Vec<&'static str>,
    pub programs: Vec<Program>,
    /// For a matmul kernel, the matmul kernel its product runs on (a tile name: `simt`,
    /// `register8`, `coop-high`, ...; `generated` for the generated fallback, `empty` for a
    /// product with nothing to write).
    pub matmul: Option<&'static str>,
    /// The loops of each program, in the order of `programs`.
    pub loops: Vec<Loops>,
}

impl PlanPrograms {
    /// What a micro-batch run of gradient accumulation executes, when the plan has one: the
    /// indices (in [`PlanPrograms::all`]'s order) of the programs of its kernels and of its
    /// updates' commits, and the indices of its updates' copies.
    pub fn micro_batch(&self, plan: &crate::plan::Plan) -> Option<(Vec<usize>, Vec<usize>)> {
        let m = plan.micro.as_ref()?;
        let mut starts = Vec::with_capacity(self.kernels.len());
        let mut at = 0;
        for k in &self.kernels {
            starts.push(at..at + k.programs.len());
            at += k.programs.len();
        }
        let mut runs: Vec<usize> =
            m.kernels.iter().filter_map(|&k| starts.get(k).cloned()).flatten().collect();
        let applied = |i: &usize| self.applies.get(*i).is_some_and(|u| m.updates.contains(u));
        runs.extend((0..self.commits.len()).filter(applied).map(|c| at + c));
        Some((runs, (0..self.copies.len()).filter(applied).collect()))
    }

    /// Every program in execution order: the kernels', then the commits.
    pub fn all(&self) -> impl Iterator<Item = &Program> {
        self.kernels.iter().flat_map(|k| &k.programs).chain(&self.commits)
    }

    /// Bytes of the scratch slots and filled buffers that live outside the plan's buffers.
    pub fn scratch_bytes(&self) -> u64 {
        let slots: u64 = self.scratch_words.iter().map(|w| w.max(&1) * 4).sum();
        let mut filled: Vec<(u32, usize)> = Vec::new();
        for p in self.all() {
            for b in &p.bindings {
                if let Resource::Filled { value, words } = b.resource {
                    if !filled.contains(&(value.to_bits(), words)) {
                        filled.push((value.to_bits(), words));
                    }
                }
            }
        }
        slots + filled.iter().map(|&(_, w)| w.max(1) as u64 * 4).sum::<u64>()
    }

    /// The WGSL of every kernel (or of kernel `only`), each program under a comment naming the
    /// kernel, its kind and the ops it computes, its dispatch and what each binding holds.
    pub fn listing(&self, only: Option<usize>) -> Result<String> {
        let n = self.kernels.len();
        if let Some(k) = only.filter(|&k| k >= n) {
            return Err(err!(
                Usage,
                "there is no kernel {k}: the plan has {n} kernels, numbered from 0"
            ));
        }
        let mut s = String::new();
        for (i, k) in self.kernels.iter().enumerate() {
            if only.is_some_and(|o| o != i) {
                continue;
            }
            s.push_str(&format!("// kernel {i}: {} ({})\n", k.kind, k.ops.join(" ")));
            if k.programs.is_empty() {
                s.push_str(
                    "// no dispatch of its own: nothing to compute, or run by an earlier kernel's \
                     merged dispatch (labels joined by ` + `)\n\n",
                );
            }
            for p in &k.programs {
                s.push_str(&header(p));
                s.push_str(&p.wgsl);
                s.push('\n');
            }
        }
        if only.is_none() {
            for p in &self.commits {
                s.push_str("// update\n");
                s.push_str(&header(p));
                s.push_str(&p.wgsl);
                s.push('\n');
            }
        }
        Ok(s)
    }
}

/// Words of each scratch slot `programs` bind: the largest any of them binds.
pub fn scratch_words<'a>(programs: impl Iterator<Item = &'a Program>) -> Vec<u64> {
    let mut words: Vec<u64> = Vec::new();
    for b in programs.flat_map(|p| &p.bindings) {
        if let Resource::Scratch { slot } = b.resource {
            if words.len() <= slot {
                words.resize(slot + 1, 0);
            }
            words[slot] = words[slot].max(b.words);
        }
    }
    words
}

/// The comment above a program in a listing.
fn header(p: &Program) -> String {
    let grid = match p.grid {
        Grid::Linear(n) => format!("{n} workgroups"),
        Grid::Fixed([x, y, z]) => format!("{x}x{y}x{z} workgroups"),
    };
    let mut s =
        format!("// dispatch `{}`: entry `{}`, {grid} of {}\n", p.label, p.entry, p.workgroup_size);
    for b in &p.bindings {
        let what = match &b.resource {
            Resource::Buffer(i) => format!("buffer {i}"),
            Resource::Status => "status".to_string(),
            Resource::Meta => "meta (step counter)".to_string(),
            Resource::Scratch { slot } => format!("scratch slot {slot}"),
            Resource::Uniform(bytes) => format!("uniform of {} bytes", bytes.len()),
            Resource::Filled { value, words } => format!("{words} x {value}"),
        };
        s.push_str(&format!("//   @binding({}) {}: {what}\n", b.at, b.name));
    }
    s
}
