//! Horizontal merging: adjacent dispatches of a plan that touch no common memory run as one.
//!
//! Every dispatch costs the GPU a few microseconds of launch and drain whatever it computes,
//! and a small one (a split-K sum, a LayerNorm's parameter gradients, an operand's conversion)
//! leaves most of a large GPU idle. Two dispatches next to each other in execution order whose
//! bindings neither overlap a range the other writes nor put one buffer in two roles (wgpu
//! refuses a buffer bound read-only and writable in one dispatch) can run concurrently: they
//! become one program whose workgroups `0..n0` run the first's entry point, `n0..n0+n1` the
//! second's, and so on, each seeing the workgroup id and count of its own grid.
//!
//! The merge works on the WGSL text of finished programs, so it needs nothing from the
//! generators: each part's module-scope names get a prefix (`m0_`, `m1_`, ...), its bindings
//! move past the previous parts', its entry point becomes a plain function taking the builtins
//! it took, and a new entry point `main` chooses the part from the linear workgroup id (a
//! workgroup-uniform branch, so barriers inside a part stay in uniform control flow). naga
//! parses each part (workgroup size, builtins, which bindings are writable, workgroup memory)
//! and validates the merged module; a merge naga refuses is an error in debug builds (tests)
//! and is left undone in release builds.
//!
//! Parts that cooperate within a workgroup (workgroup memory, barriers, subgroup operations)
//! must agree on threads per workgroup, which the merged dispatch takes; an independent part
//! (each invocation on its own) of another size has its invocations handed out in order over
//! those workgroups, when they have at least `MIN_REBLOCKED` (64) threads. Every entry point is
//! one-dimensional. The merged program keeps every runtime check any part asked for (a part
//! that turned them off takes them only if it declares at most `LIGHT_WORKGROUP_BYTES`, 4 KiB,
//! of workgroup memory: not a shared-memory product), and
//! together the parts stay within the device's storage bindings and workgroup memory, adding
//! at most `MAX_ADDED_WORKGROUP_BYTES` (4 KiB) to the largest part's.
//! Programs on cooperative matrices are left alone (their operations want subgroup-uniform
//! control flow the driver sees plainly). Kernels of a micro-batch run merge only with
//! kernels of it, so the run still executes whole programs; a plan whose gradients are
//! exchanged between ranks (which start at kernel boundaries) is not merged
//! ([`Target::merge_dispatches`]).

use super::loops::Loops;
use super::program::{Binding, Grid, PlanPrograms, Program, Resource, ShaderChecks, Target};
use crate::err;
use crate::error::Result;
use crate::plan::Plan;
use std::collections::{HashMap, HashSet};

/// Parts one merged dispatch holds at most (a longer list gains little and makes a long
/// module).
const MAX_PARTS: usize = 4;

/// The fewest threads per workgroup an independent part is handed out over, other than its
/// own: workgroups of a single subgroup of 32 would leave half of an NVIDIA multiprocessor's
/// warps unused (at most 32 workgroups a multiprocessor).
const MIN_REBLOCKED: u32 = 64;

/// Bytes of workgroup memory a merge may add to its largest part's: every part's workgroup
/// memory is declared in the merged module, whichever part a workgroup runs, so a merge that
/// added much would fit fewer of the largest part's workgroups on a multiprocessor (two
/// shared-memory products). 4 KiB is under 2% of an H200 multiprocessor's 228 KiB.
const MAX_ADDED_WORKGROUP_BYTES: u64 = 4096;

/// The most workgroup memory a part that turned runtime checks off may declare and still take
/// the checks of the parts it merges with. The programs that turn them off for speed and
/// declare more are shared-memory product tiles, whose loops naga's guard slows most: on the
/// H200 merging such products with checked split-K sums made gpt-medium `highest`'s step
/// 1.2 ms slower, where the conversions (under 4 KiB) lost nothing measurable (BENCHMARKS.md,
/// "Merged dispatches").
const LIGHT_WORKGROUP_BYTES: u64 = 4096;

/// Uniform bindings a stage may have (WebGPU's default `max_uniform_buffers_per_shader_stage`).
const MAX_UNIFORMS: usize = 12;

/// Whether `RUMUS_MERGE_DISPATCHES` leaves merging on (unset, `on` or `1`; `off` or `0` turns
/// it off, for measuring what it gains); an error naming the variable for any other value.
pub fn from_env() -> Result<bool> {
    crate::error::env_choice(SWITCH, SETTINGS)
}

const SWITCH: &str = "RUMUS_MERGE_DISPATCHES";
const SETTINGS: &[(&str, bool)] = &[("on", true), ("off", false), ("1", true), ("0", false)];

/// Merge adjacent independent programs of `out`'s kernels (not its commits): a merged program
/// takes the place of its first part, in that part's kernel, and the other parts leave their
/// kernels' lists (a kernel may be left with none of its own).
pub fn merge(plan: &Plan, out: &mut PlanPrograms, target: &Target) -> Result<()> {
    let roots = roots(plan);
    let micro: Option<HashSet<usize>> =
        plan.micro.as_ref().map(|m| m.kernels.iter().copied().collect());
    let in_micro = |k: usize| micro.as_ref().is_some_and(|m| m.contains(&k));
    let order: Vec<(usize, usize)> = out
        .kernels
        .iter()
        .enumerate()
        .flat_map(|(k, kp)| (0..kp.programs.len()).map(move |i| (k, i)))
        .collect();
    let program = |at: usize| &out.kernels[order[at].0].programs[order[at].1];
    // Each program's part, parsed once per module and entry point.
    let parts: Vec<Option<Part>> = {
        let mut parsed: HashMap<(&str, &str), Option<Part>> = HashMap::new();
        (0..order.len())
            .map(|at| {
                let p = program(at);
                parsed.entry((&p.wgsl, p.entry)).or_insert_with(|| Part::of(p)).clone()
            })
            .collect()
    };
    // Groups of adjacent programs (positions in `order`), each to run as one dispatch.
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut group: Vec<usize> = Vec::new();
    let mut uses: Vec<Access> = Vec::new();
    let mut totals = Totals::default();
    // Threads per workgroup of the group's members, and whether each is independent.
    let mut shapes: Vec<(u32, bool)> = Vec::new();
    for (at, part) in parts.iter().enumerate() {
        let p = program(at);
        let Some(part) = part else {
            close(&mut groups, &mut group);
            continue;
        };
        let mine = accesses(p, part, &roots);
        let mut add = totals.add(p, part);
        let shape = (p.workgroup_size, part.independent);
        let checks = group
            .iter()
            .map(|&g| (program(g).checks, parts[g].as_ref().map_or(0, |x| x.workgroup_bytes)))
            .chain([(p.checks, part.workgroup_bytes)]);
        let joins = group.first().is_some_and(|&first| {
            let (k0, k) = (order[first].0, order[at].0);
            group.len() < MAX_PARTS
                && threads_of(shapes.iter().chain([&shape]).copied()).is_some()
                && checks_of(checks).is_some()
                && in_micro(k0) == in_micro(k)
                && add.fits(target)
                && !mine.iter().any(|a| uses.iter().any(|b| a.conflicts(b)))
        });
        if !joins {
            close(&mut groups, &mut group);
            uses.clear();
            add = Totals::default().add(p, part);
            shapes.clear();
        }
        shapes.push(shape);
        group.push(at);
        uses.extend(mine);
        totals = add;
    }
    close(&mut groups, &mut group);
    let mut checked = HashMap::new();
    let merged: Vec<(Vec<usize>, Program)> = groups
        .into_iter()
        .filter_map(|group| {
            let members: Vec<(&Program, &Part)> =
                group.iter().filter_map(|&at| Some((program(at), parts[at].as_ref()?))).collect();
            match merged(&members, &mut checked) {
                Ok(p) => Some(Ok((group, p))),
                Err(e) if cfg!(debug_assertions) => Some(Err(e)),
                Err(_) => None,
            }
        })
        .collect::<Result<_>>()?;
    // Later groups first, so the positions of earlier ones stay valid.
    for (group, program) in merged.into_iter().rev() {
        let loops = group.iter().map(|&at| out.kernels[order[at].0].loops[order[at].1]);
        let loops = loops.reduce(Loops::or).unwrap_or(Loops::NONE);
        for &at in group[1..].iter().rev() {
            let (k, i) = order[at];
            out.kernels[k].programs.remove(i);
            out.kernels[k].loops.remove(i);
        }
        let (k, i) = order[group[0]];
        out.kernels[k].programs[i] = program;
        out.kernels[k].loops[i] = loops;
    }
    Ok(())
}

/// Threads per workgroup of a merged dispatch of parts of these (threads per workgroup,
/// independent): those of the parts that cooperate within a workgroup, which must agree, else
/// the first part's. `None` when they disagree, or when an independent part would run in
/// workgroups of fewer than [`MIN_REBLOCKED`] threads other than its own.
fn threads_of(shapes: impl Iterator<Item = (u32, bool)> + Clone) -> Option<u32> {
    let mut cooperating = shapes.clone().filter(|&(_, independent)| !independent).map(|s| s.0);
    let threads = match cooperating.next() {
        Some(t) => t,
        None => shapes.clone().next()?.0,
    };
    let agree = cooperating.all(|t| t == threads);
    let fits = shapes.into_iter().all(|(t, _)| t == threads || threads >= MIN_REBLOCKED);
    (agree && fits).then_some(threads)
}

/// The runtime checks of a merged dispatch of parts with these (checks, workgroup bytes): every
/// check any part asks for. `None` when a part that turned a check off would get it back and
/// declares more than [`LIGHT_WORKGROUP_BYTES`] of workgroup memory.
fn checks_of(parts: impl Iterator<Item = (ShaderChecks, u64)> + Clone) -> Option<ShaderChecks> {
    let none = ShaderChecks { bounds: false, loop_bounding: false };
    let all = parts.clone().fold(none, |c, (p, _)| ShaderChecks {
        bounds: c.bounds || p.bounds,
        loop_bounding: c.loop_bounding || p.loop_bounding,
    });
    parts.into_iter().all(|(c, bytes)| c == all || bytes <= LIGHT_WORKGROUP_BYTES).then_some(all)
}

/// End the current group: kept when it merges two or more programs.
fn close(groups: &mut Vec<Vec<usize>>, group: &mut Vec<usize>) {
    if group.len() > 1 {
        groups.push(std::mem::take(group));
    }
    group.clear();
}

/// What a group of parts uses of the device's per-dispatch limits.
#[derive(Clone, Copy, Default)]
struct Totals {
    storage: usize,
    uniforms: usize,
    workgroup_bytes: u64,
    /// The most workgroup memory one part declares.
    largest_workgroup_bytes: u64,
    workgroups: u64,
}

impl Totals {
    fn add(self, p: &Program, part: &Part) -> Totals {
        let uniform = |b: &&Binding| matches!(b.resource, Resource::Uniform(_) | Resource::Meta);
        let uniforms = p.bindings.iter().filter(uniform).count();
        Totals {
            storage: self.storage + p.bindings.len() - uniforms,
            uniforms: self.uniforms + uniforms,
            workgroup_bytes: self.workgroup_bytes + part.workgroup_bytes,
            largest_workgroup_bytes: self.largest_workgroup_bytes.max(part.workgroup_bytes),
            workgroups: self.workgroups + workgroups(p.grid),
        }
    }

    fn fits(&self, target: &Target) -> bool {
        self.storage <= target.max_storage_buffers as usize
            && self.uniforms <= MAX_UNIFORMS
            && self.workgroup_bytes <= u64::from(target.max_workgroup_bytes)
            && self.workgroup_bytes - self.largest_workgroup_bytes <= MAX_ADDED_WORKGROUP_BYTES
            && self.workgroups <= u64::from(u32::MAX)
    }
}

fn workgroups(grid: Grid) -> u64 {
    match grid {
        Grid::Linear(n) => u64::from(n),
        Grid::Fixed([x, y, z]) => u64::from(x) * u64::from(y) * u64::from(z),
    }
}

/// Each plan buffer's root (the buffer it lies in that lies in no other) and its range of
/// bytes there.
fn roots(plan: &Plan) -> Vec<(usize, u64, u64)> {
    let mut place: Vec<(usize, u64, u64)> = Vec::with_capacity(plan.buffers.len());
    for (i, b) in plan.buffers.iter().enumerate() {
        let (root, at) = match b.within {
            Some((parent, offset)) if parent < i => {
                let (root, at, _) = place[parent];
                (root, at.saturating_add(offset))
            }
            _ => (i, 0),
        };
        place.push((root, at, at.saturating_add(b.bytes)));
    }
    place
}

/// A device buffer a program binds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Root {
    Buffer(usize),
    Scratch(usize),
    Status,
}

/// A range of a device buffer a program binds, and whether it is bound writable.
#[derive(Clone, Copy, Debug)]
struct Access {
    root: Root,
    start: u64,
    end: u64,
    writes: bool,
}

impl Access {
    /// Whether two programs binding these cannot run as one dispatch: one may write what the
    /// other touches, or one buffer would be bound both read-only and writable.
    fn conflicts(&self, other: &Access) -> bool {
        self.root == other.root
            && (self.writes != other.writes
                || self.writes && self.start < other.end && other.start < self.end)
    }
}

/// The device buffers `p` binds (uniforms and filled constants are its own or read-only).
fn accesses(p: &Program, part: &Part, roots: &[(usize, u64, u64)]) -> Vec<Access> {
    p.bindings
        .iter()
        .filter_map(|b| {
            // A binding the module does not declare as read-only storage counts as written.
            let writes = part.read_only.get(&b.at) != Some(&true);
            let whole = |root| Access { root, start: 0, end: u64::MAX, writes };
            match b.resource {
                // The runtime binds plan buffer i whole: its range of its root.
                Resource::Buffer(i) => Some(match roots.get(i) {
                    Some(&(root, start, end)) => Access { root: Root::Buffer(root), start, end, writes },
                    None => whole(Root::Buffer(i)),
                }),
                Resource::Scratch { slot } => Some(whole(Root::Scratch(slot))),
                Resource::Status => Some(whole(Root::Status)),
                Resource::Uniform(_) | Resource::Meta | Resource::Filled { .. } => None,
            }
        })
        .collect()
}

/// What the merge needs to know of one program's module.
#[derive(Clone, Debug)]
struct Part {
    /// The builtins its entry point takes, in order.
    args: Vec<naga::BuiltIn>,
    /// For each binding of group 0 the module declares: whether it is read-only (a uniform, or
    /// storage without write access).
    read_only: HashMap<u32, bool>,
    /// One more than the largest binding the module declares.
    bindings_end: u32,
    /// Bytes of workgroup memory the module declares (all of it, used or not: a bound).
    workgroup_bytes: u64,
    /// No invocation depends on another of its workgroup (no workgroup memory, barriers or
    /// subgroup operations anywhere in the module): the part runs as well in workgroups of
    /// any size, its invocations handed out in order.
    independent: bool,
}

impl Part {
    /// `None` when `p` cannot be a part: its module does not parse, its entry point is not
    /// one-dimensional with `p.workgroup_size` threads, takes anything but the builtins
    /// `main` passes on, or it runs on cooperative matrices.
    fn of(p: &Program) -> Option<Part> {
        if p.wgsl.contains("wgpu_cooperative_matrix") || workgroups(p.grid) == 0 {
            return None;
        }
        let module = naga::front::wgsl::parse_str(&p.wgsl).ok()?;
        if !module.overrides.is_empty() {
            return None;
        }
        let ep = module.entry_points.iter().find(|e| e.name == p.entry)?;
        if ep.workgroup_size != [p.workgroup_size, 1, 1] || ep.workgroup_size_overrides.is_some()
        {
            return None;
        }
        let mut args = Vec::new();
        for a in &ep.function.arguments {
            match a.binding {
                Some(naga::Binding::BuiltIn(b)) if argument(b, 1).is_some() => args.push(b),
                _ => return None,
            }
        }
        let mut read_only = HashMap::new();
        let mut bindings_end = 0;
        let mut workgroup_bytes = 0u64;
        for (_, var) in module.global_variables.iter() {
            if let Some(rb) = &var.binding {
                if rb.group != 0 {
                    return None;
                }
                let ro = match var.space {
                    naga::AddressSpace::Uniform => true,
                    naga::AddressSpace::Storage { access } => {
                        !access.contains(naga::StorageAccess::STORE)
                    }
                    _ => false,
                };
                read_only.insert(rb.binding, ro);
                bindings_end = bindings_end.max(rb.binding + 1);
            }
            if var.space == naga::AddressSpace::WorkGroup {
                workgroup_bytes += u64::from(module.types[var.ty].inner.size(module.to_ctx()));
            }
        }
        let cooperating = ["Barrier", "workgroupUniformLoad", "subgroup", "quad"];
        let independent =
            workgroup_bytes == 0 && !cooperating.iter().any(|w| p.wgsl.contains(w));
        Some(Part { args, read_only, bindings_end, workgroup_bytes, independent })
    }
}

/// The expression `main` passes to a part for builtin `b` (in scope: the part's workgroup id
/// `w`, its grid `n` and the invocation's index `l` in its workgroup of `threads`); `None` for
/// a builtin `main` does not pass on.
fn argument(b: naga::BuiltIn, threads: u32) -> Option<String> {
    use naga::BuiltIn as B;
    Some(match b {
        B::WorkGroupId => "w".into(),
        B::NumWorkGroups => "n".into(),
        B::LocalInvocationId => "vec3<u32>(l, 0u, 0u)".into(),
        B::LocalInvocationIndex => "l".into(),
        B::GlobalInvocationId => format!("vec3<u32>(w.x * {threads}u + l, w.y, w.z)"),
        _ => return None,
    })
}

/// The program running `parts` as one dispatch.
/// `checked` holds naga's verdict on each merged module validated before (a model's layers
/// merge alike: the texts name no node, so identical merges are validated once).
fn merged(parts: &[(&Program, &Part)], checked: &mut HashMap<String, Verdict>) -> Result<Program> {
    // Workgroups of the size the cooperating parts need; the others' invocations are handed
    // out in order over workgroups of that size.
    let shapes = parts.iter().map(|(p, part)| (p.workgroup_size, part.independent));
    let threads = threads_of(shapes)
        .ok_or_else(|| err!(Invariant, "merge: parts whose workgroups disagree"))?;
    // A part needing a check gets it; the others pay for it.
    let checks = checks_of(parts.iter().map(|(p, part)| (p.checks, part.workgroup_bytes)))
        .ok_or_else(|| err!(Invariant, "merge: a heavy part would get runtime checks back"))?;
    let labels: Vec<&str> = parts.iter().map(|(p, _)| p.label.as_str()).collect();
    let mut directives: Vec<String> = Vec::new();
    let mut bodies = String::new();
    let mut bindings = Vec::new();
    let mut calls = String::new();
    let mut offset = 0u32;
    let mut start = 0u64;
    for (n, (p, part)) in parts.iter().enumerate() {
        let prefix = format!("m{n}_");
        let text = rewrite(&p.wgsl, &prefix, p.entry, offset, &mut directives)?;
        bodies.push_str(&format!("\n// ---- part {n}\n"));
        bodies.push_str(&text);
        bindings.extend(p.bindings.iter().map(|b| Binding { at: b.at + offset, ..b.clone() }));
        let [x, y, z] = match p.grid {
            Grid::Linear(n) => [n, 1, 1],
            Grid::Fixed(g) => g,
        };
        let own = p.workgroup_size;
        let invocations = workgroups(p.grid) * u64::from(own);
        let (count, pick) = if own == threads {
            (workgroups(p.grid), "let v = at - {start}u;\n        let l = merged_lii;".to_string())
        } else if invocations <= u64::from(u32::MAX) {
            let pick = format!(
                "let i = (at - {{start}}u) * {threads}u + merged_lii;\n        if i >= {invocations}u {{\n            return;\n        }}\n        let v = i / {own}u;\n        let l = i % {own}u;"
            );
            (invocations.div_ceil(u64::from(threads)), pick)
        } else {
            return Err(err!(Invariant, "merge: `{}` has too many invocations", p.label));
        };
        let end = start + count;
        let args: Vec<String> = part.args.iter().filter_map(|&b| argument(b, own)).collect();
        let cond = if n + 1 == parts.len() { String::new() } else { format!("if at < {end}u ") };
        let els = if n == 0 { "    " } else { " else " };
        calls.push_str(&format!(
            "{els}{cond}{{\n        {pick}\n        let w = vec3<u32>(v % {x}u, v / {x}u % {y}u, v / {xy}u);\n        let n = vec3<u32>({x}u, {y}u, {z}u);\n        {prefix}{entry}({args});\n    }}",
            pick = pick.replace("{start}", &start.to_string()),
            xy = u64::from(x) * u64::from(y),
            entry = p.entry,
            args = args.join(", "),
        ));
        start = end;
        offset += part.bindings_end;
    }
    let mut wgsl = String::new();
    for d in &directives {
        wgsl.push_str(d);
        wgsl.push('\n');
    }
    wgsl.push_str(&format!(
        "// {} dispatches run as one (codegen/merge.rs): workgroups are handed out to the parts in order.\n",
        parts.len()
    ));
    wgsl.push_str(&bodies);
    wgsl.push_str(&format!(
        "\n// ---- the merged entry point\n@compute @workgroup_size({threads})\nfn main(\n    @builtin(workgroup_id) merged_wid: vec3<u32>,\n    @builtin(num_workgroups) merged_nwg: vec3<u32>,\n    @builtin(local_invocation_index) merged_lii: u32,\n) {{\n    let at = merged_wid.x + merged_nwg.x * (merged_wid.y + merged_nwg.y * merged_wid.z);\n    if at >= {start}u {{\n        return;\n    }}\n{calls}\n}}\n"
    ));
    let verdict = checked.entry(wgsl.clone()).or_insert_with_key(|w| validate(w));
    verdict.clone().map_err(|e| {
        err!(Invariant, "merging `{}` made a module naga refuses: {e}\n{wgsl}", labels.join("` + `"))
    })?;
    let total = u32::try_from(start)
        .map_err(|_| err!(Invariant, "a merged dispatch of {start} workgroups"))?;
    Ok(Program {
        label: labels.join(" + "),
        wgsl,
        entry: "main",
        workgroup_size: threads,
        bindings,
        grid: Grid::Linear(total),
        checks,
    })
}

/// naga's verdict on a module: `Err` with its rendered error.
type Verdict = std::result::Result<(), String>;

fn validate(wgsl: &str) -> Verdict {
    let module = naga::front::wgsl::parse_str(wgsl).map_err(|e| e.emit_to_string(wgsl))?;
    let caps = naga::valid::Capabilities::all();
    naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps)
        .validate(&module)
        .map(drop)
        .map_err(|e| e.emit_to_string(wgsl))
}

/// Kinds of WGSL token, as far as the rewrite tells them apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Ident,
    Number,
    /// One character of anything else.
    Punct,
    /// Whitespace and comments.
    Trivia,
}

/// `s` cut into tokens, every byte in exactly one.
fn tokens(s: &str) -> Vec<(Kind, &str)> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let start = i;
        let c = b[i];
        let kind = if c.is_ascii_whitespace() {
            while i < b.len() && b[i].is_ascii_whitespace() {
                i += 1;
            }
            Kind::Trivia
        } else if b[i..].starts_with(b"//") {
            i = b[i..].iter().position(|&c| c == b'\n').map_or(b.len(), |e| i + e);
            Kind::Trivia
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            i = i.min(b.len());
            Kind::Trivia
        } else if c.is_ascii_alphabetic() || c == b'_' {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            Kind::Ident
        } else if c.is_ascii_digit() || c == b'.' && b.get(i + 1).is_some_and(u8::is_ascii_digit) {
            let hex = b[i..].starts_with(b"0x") || b[i..].starts_with(b"0X");
            i += 1;
            while i < b.len() {
                let d = b[i];
                let exponent = if hex { b"pP" } else { b"eE" };
                let sign = (d == b'+' || d == b'-') && exponent.contains(&b[i - 1]);
                if !(d.is_ascii_alphanumeric() || d == b'_' || d == b'.' || sign) {
                    break;
                }
                i += 1;
            }
            Kind::Number
        } else {
            i += s[i..].chars().next().map_or(1, char::len_utf8);
            Kind::Punct
        };
        out.push((kind, &s[start..i]));
    }
    out
}

/// Module `src` rewritten as part of a merged module: every module-scope name prefixed with
/// `prefix`, every `@binding` moved up by `offset`, and entry point `entry` made a plain
/// function (no `@compute`, `@workgroup_size` or `@builtin`); its `enable`, `requires` and
/// `diagnostic` directives move to `directives` (once each), where a merged module declares
/// them first.
fn rewrite(
    src: &str,
    prefix: &str,
    entry: &str,
    offset: u32,
    directives: &mut Vec<String>,
) -> Result<String> {
    let toks = tokens(src);
    let sig: Vec<usize> = (0..toks.len()).filter(|&i| toks[i].0 != Kind::Trivia).collect();
    let text = |j: usize| sig.get(j).map_or("", |&i| toks[i].1);
    let is = |j: usize, s: &str| text(j) == s;
    // The sig index of the bracket closing the one opening at sig index `j`.
    let closing = |j: usize, open: &str, close: &str| {
        let mut depth = 0usize;
        for k in j..sig.len() {
            if is(k, open) {
                depth += 1;
            } else if is(k, close) {
                depth -= 1;
                if depth == 0 {
                    return Some(k);
                }
            }
        }
        None
    };
    let unmatched = || err!(Invariant, "merge: unbalanced brackets in a module");

    let mut names: HashSet<&str> = HashSet::new();
    let mut cut = vec![false; sig.len()]; // tokens left out (with the trivia before them)
    let mut member = vec![false; sig.len()]; // struct member names
    let mut keep = vec![false; sig.len()]; // attribute arguments that are not names
    let mut binding_number = vec![false; sig.len()];
    let mut entry_at = None;
    let mut depth = 0usize;
    let mut j = 0;
    while j < sig.len() {
        let t = text(j);
        let after_at = j > 0 && is(j - 1, "@");
        match t {
            "{" => depth += 1,
            "}" => depth = depth.saturating_sub(1),
            "enable" | "requires" | "diagnostic" if depth == 0 && !after_at => {
                let mut end = j;
                while end < sig.len() && !is(end, ";") {
                    end += 1;
                }
                let words: Vec<&str> = (j..=end.min(sig.len() - 1)).map(text).collect();
                let d = words.join(" ").replace(" ;", ";").replace(" ,", ",");
                if !directives.contains(&d) {
                    directives.push(d);
                }
                cut[j..=end.min(sig.len() - 1)].fill(true);
                j = end + 1;
                continue;
            }
            "fn" | "struct" | "alias" | "const" | "override" | "var" if depth == 0 => {
                let mut k = j + 1;
                if t == "var" && is(k, "<") {
                    k = closing(k, "<", ">").ok_or_else(unmatched)? + 1;
                }
                let name = text(k);
                names.insert(name);
                if t == "fn" && name == entry {
                    entry_at = Some(j);
                }
                if t == "struct" && is(k + 1, "{") {
                    let end = closing(k + 1, "{", "}").ok_or_else(unmatched)?;
                    for m in k + 2..end {
                        if toks[sig[m]].0 == Kind::Ident && is(m + 1, ":") && !is(m - 1, "@") {
                            member[m] = true;
                        }
                    }
                }
            }
            "@" => {
                let name = text(j + 1);
                let end = if is(j + 2, "(") {
                    closing(j + 2, "(", ")").ok_or_else(unmatched)?
                } else {
                    j + 1
                };
                match name {
                    "binding" if end > j + 1 => binding_number[j + 3..end].fill(true),
                    "builtin" | "diagnostic" | "interpolate" => keep[j + 1..=end].fill(true),
                    _ => {}
                }
            }
            _ => {}
        }
        j += 1;
    }
    let Some(f) = entry_at else {
        return Err(err!(Invariant, "merge: the module has no function `{entry}`"));
    };
    // The entry point's attributes: those ending right before `fn`, back to the previous
    // declaration.
    let mut k = f;
    while k > 0 {
        // Find an attribute `@name` or `@name(...)` ending at k - 1.
        let end = k - 1;
        let start = if is(end, ")") {
            let mut depth = 0usize;
            let mut s = end;
            loop {
                if is(s, ")") {
                    depth += 1;
                } else if is(s, "(") {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                if s == 0 {
                    return Err(unmatched());
                }
                s -= 1;
            }
            s.checked_sub(2)
        } else {
            end.checked_sub(1)
        };
        match start {
            Some(s) if is(s, "@") && toks[sig[s + 1]].0 == Kind::Ident => {
                if matches!(text(s + 1), "compute" | "workgroup_size") {
                    cut[s..=end].fill(true);
                }
                k = s;
            }
            _ => break,
        }
    }
    let open = f + 2;
    if !is(open, "(") {
        return Err(err!(Invariant, "merge: `fn {entry}` has no parameter list"));
    }
    let close = closing(open, "(", ")").ok_or_else(unmatched)?;
    for a in open..close {
        if is(a, "@") && is(a + 1, "builtin") && is(a + 2, "(") {
            let end = closing(a + 2, "(", ")").ok_or_else(unmatched)?;
            cut[a..=end].fill(true);
        }
    }

    let mut out = String::with_capacity(src.len() + 64);
    let mut next_sig = 0;
    let mut pending = String::new(); // trivia before the next significant token
    for (i, &(kind, s)) in toks.iter().enumerate() {
        if kind == Kind::Trivia {
            pending.push_str(s);
            continue;
        }
        let j = next_sig;
        next_sig += 1;
        debug_assert_eq!(sig[j], i);
        if cut[j] {
            // Keep line breaks of removed text, drop its other trivia.
            if pending.contains('\n') && !out.ends_with('\n') {
                out.push('\n');
            }
            pending.clear();
            continue;
        }
        out.push_str(&pending);
        pending.clear();
        let renamed = kind == Kind::Ident
            && names.contains(s)
            && !member[j]
            && !keep[j]
            && !(j > 0 && is(j - 1, "."));
        if renamed {
            out.push_str(prefix);
            out.push_str(s);
        } else if binding_number[j] && kind == Kind::Number {
            let digits = s.bytes().take_while(u8::is_ascii_digit).count();
            let n: u32 = s[..digits]
                .parse()
                .map_err(|_| err!(Invariant, "merge: a binding number `{s}`"))?;
            out.push_str(&format!("{}{}", n + offset, &s[digits..]));
        } else {
            out.push_str(s);
        }
    }
    out.push_str(&pending);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codegen::program::ShaderChecks;

    #[test]
    fn tokens_cover_the_text() {
        let src = "enable f16;\n/* a /* nested */ comment */ const X: f32 = 1.5e-3;\n// é\nfn f() {}";
        let toks = tokens(src);
        assert_eq!(toks.iter().map(|t| t.1).collect::<String>(), src);
        assert!(toks.contains(&(Kind::Number, "1.5e-3")));
        assert!(toks.contains(&(Kind::Trivia, "/* a /* nested */ comment */")));
    }

    const A: &str = "enable f16;
struct Params { n: u32, scale: f32 }
const n: u32 = 4u;
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
var<workgroup> red: array<f32, 64>;
fn twice(x: f32) -> f32 { return 2.0 * x; }
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    red[t] = p.scale;
    workgroupBarrier();
    let i = wid.x * 64u + t;
    if i < p.n * n { out[i] = twice(red[63u - t]); }
}
";

    #[test]
    fn rewrite_prefixes_module_names_and_moves_bindings() {
        let mut directives = Vec::new();
        let text = rewrite(A, "m1_", "main", 5, &mut directives).unwrap();
        assert_eq!(directives, ["enable f16;"]);
        assert!(!text.contains("enable"), "{text}");
        // Declarations and uses renamed; members, swizzles and builtins not.
        for s in ["struct m1_Params { n: u32, scale: f32 }", "const m1_n: u32", "var<uniform> m1_p: m1_Params",
            "@binding(5) var<uniform>", "@binding(6) var<storage, read_write> m1_out", "m1_red[t] = m1_p.scale",
            "m1_p.n * m1_n", "m1_twice(m1_red[63u - t])", "fn m1_main(", "wid.x * 64u"]
        {
            assert!(text.contains(s), "`{s}` missing from\n{text}");
        }
        assert!(!text.contains("@compute") && !text.contains("@builtin") && !text.contains("@workgroup_size"));
        assert!(matches!(rewrite(A, "m0_", "nowhere", 0, &mut directives), Err(e) if e.message.contains("no function `nowhere`")));
    }

    fn program(wgsl: &str, label: &str, grid: Grid, bindings: Vec<Binding>, threads: u32) -> Program {
        Program {
            label: label.into(),
            wgsl: wgsl.into(),
            entry: "main",
            workgroup_size: threads,
            bindings,
            grid,
            checks: ShaderChecks::ALL,
        }
    }

    fn binding(at: u32, resource: Resource) -> Binding {
        Binding { at, name: format!("b{at}"), resource, words: 0 }
    }

    /// Builtins of a one-dimensional grid, an independent part re-blocked into the other's
    /// workgroups, checks combined: the merged module is one naga accepts.
    #[test]
    fn merged_module_validates() {
        let b = "@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if i < arrayLength(&y) { y[i] = x[i] + 1.0; }
}
";
        let pa = program(A, "a", Grid::Fixed([3, 2, 1]), vec![binding(0, Resource::Uniform(vec![0; 8])), binding(1, Resource::Buffer(0))], 64);
        let mut pb = program(b, "b", Grid::Linear(5), vec![binding(0, Resource::Buffer(1)), binding(2, Resource::Buffer(2))], 256);
        pb.checks = ShaderChecks { bounds: false, loop_bounding: false };
        let (a, b) = (Part::of(&pa).unwrap(), Part::of(&pb).unwrap());
        assert!(!a.independent && b.independent);
        assert_eq!((a.workgroup_bytes, a.bindings_end, b.bindings_end), (256, 2, 3));
        let m = merged(&[(&pa, &a), (&pb, &b)], &mut HashMap::new()).unwrap();
        assert_eq!(m.label, "a + b");
        assert_eq!(m.workgroup_size, 64);
        // 6 workgroups of a, then b's 5 x 256 invocations in workgroups of 64.
        assert_eq!(m.grid, Grid::Linear(6 + 20));
        assert_eq!(m.checks, ShaderChecks::ALL);
        let at: Vec<u32> = m.bindings.iter().map(|b| b.at).collect();
        assert_eq!(at, [0, 1, 2, 4]);
        assert!(m.wgsl.contains("if at < 6u"), "{}", m.wgsl);
    }

    #[test]
    fn conflicts_are_writes_meeting_any_use() {
        let a = |root, start, end, writes| Access { root, start, end, writes };
        let buf = Root::Buffer(3);
        // Disjoint writes into one buffer run together; overlapping ones do not.
        assert!(!a(buf, 0, 8, true).conflicts(&a(buf, 8, 16, true)));
        assert!(a(buf, 0, 9, true).conflicts(&a(buf, 8, 16, true)));
        // A read and a write of one buffer never (wgpu refuses the two roles in one dispatch).
        assert!(a(buf, 0, 8, false).conflicts(&a(buf, 64, 72, true)));
        assert!(!a(buf, 0, 8, false).conflicts(&a(buf, 0, 8, false)));
        assert!(!a(buf, 0, 8, true).conflicts(&a(Root::Buffer(4), 0, 8, true)));
        assert!(a(Root::Scratch(0), 0, u64::MAX, true).conflicts(&a(Root::Scratch(0), 0, u64::MAX, false)));
    }

    #[test]
    fn cooperating_parts_of_other_sizes_or_coop_modules_are_not_parts() {
        let pa = program(A, "a", Grid::Linear(1), vec![], 128);
        assert!(Part::of(&pa).is_none(), "workgroup size 64 read as 128");
        let coop = format!("enable wgpu_cooperative_matrix;\n{A}");
        assert!(Part::of(&program(&coop, "c", Grid::Linear(1), vec![], 64)).is_none());
    }

    #[test]
    fn heavy_parts_keep_their_checks_off_and_workgroups_agree() {
        let (off, all) = (ShaderChecks { bounds: false, loop_bounding: false }, ShaderChecks::ALL);
        assert_eq!(checks_of([(all, 0), (off, 4096)].into_iter()), Some(all));
        assert_eq!(checks_of([(all, 0), (off, 16384)].into_iter()), None);
        assert_eq!(checks_of([(off, 16384), (off, 0)].into_iter()), Some(off));
        // Cooperating parts agree; independent ones are handed out over 64 threads or more.
        assert_eq!(threads_of([(64, false), (256, true)].into_iter()), Some(64));
        assert_eq!(threads_of([(256, true), (128, false)].into_iter()), Some(128));
        assert_eq!(threads_of([(32, false), (256, true)].into_iter()), None);
        assert_eq!(threads_of([(32, false), (32, true)].into_iter()), Some(32));
        assert_eq!(threads_of([(64, false), (128, false)].into_iter()), None);
    }

    #[test]
    fn the_variable_is_on_or_off() {
        let parse = |v| crate::error::choose(SWITCH, v, SETTINGS);
        assert!(matches!(parse(None), Ok(true)));
        assert!(matches!(parse(Some(" 0 ")), Ok(false)));
        assert!(matches!(parse(Some("off")), Ok(false)));
        let e = parse(Some("no")).unwrap_err();
        assert_eq!(
            e.message,
            "RUMUS_MERGE_DISPATCHES: `no` is not `on` (the default), `off`, `1` or `0`"
        );
    }
}
