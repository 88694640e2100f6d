//! How many loop iterations one invocation of a program runs, and the adapters that cut loops
//! short.
//!
//! Mesa's software adapters (lavapipe on Vulkan, llvmpipe on OpenGL) give every invocation one
//! budget of [`SOFTWARE_LOOP_LIMIT`] loop iterations for all its loops together: each pass
//! through the end of a loop, the last one that leaves it included, takes one, and once the
//! budget is spent every loop ends at its next pass, without an error (`lp_exec_endloop` in
//! gallivm). Measured on lavapipe (Mesa 22.3): one loop of 100,000 iterations runs 65,535;
//! two of 40,000 run 40,000 and 25,534; a loop of 20,000 around one of 4 whose count the
//! driver cannot see runs 10,923 times. A kernel past the budget computes a wrong answer in
//! silence, so each generator states its programs' [`Loops`] beside the code that loops, and
//! [`super::compile`] refuses, on a target with a loop budget ([`super::Target::max_loop_trips`],
//! set for adapters wgpu reports as `DeviceType::Cpu`), any program whose bound exceeds it,
//! naming the op and its sizes.
//!
//! The bound counts every loop as written: the driver may unroll a loop of a constant count
//! (then it costs nothing), but need not, so it costs what it would. Loops whose count depends
//! on the data count at their largest (embedding backward's sum over one row's occurrences:
//! every index).
//!
//! The matmul kernels' loops (`shaders/matmul.wgsl`, `matmul_simt.rs`, `matmul_dot.rs`,
//! `matmul_coop.rs`, `coop_convert.rs`, the split-K sum of `matmul.rs`) are stated here, by
//! [`matmul_product`], [`coop_conversion`] and [`split_k_sum`], rather than beside them; the
//! tests compare every statement of loops here with the loops of the WGSL each program holds
//! (`tests/it/codegen_valid.rs`), so a loop added to a kernel and not here fails them.

use super::coop_convert::STRIP;
use super::matmul::MatmulTile;
use super::matmul_coop::{CoopKernel, CoopMode};
use super::matmul_dot::{DOT_BLOCK, DOT_LANES};
use super::program::Program;
use crate::err;
use crate::error::Result;
use crate::graph::Graph;
use crate::plan::{Kernel, KernelKind};
use crate::tensor::fmt_shape;

/// The loop iterations Mesa's software adapters give an invocation, all its loops together,
/// before every loop ends early (`LP_MAX_TGSI_LOOP_ITERATIONS`).
pub const SOFTWARE_LOOP_LIMIT: u64 = 65_535;

/// The loops of a program, for one invocation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Loops {
    /// Loop statements (`for`, `while`, `loop`) in the functions the entry point reaches,
    /// each once however often it runs: what the tests compare with the WGSL.
    pub statements: u32,
    /// The most loop iterations one invocation runs, all its loops together, each loop
    /// counting one more than its iterations every time it runs (the pass that leaves it),
    /// as the software adapters count them: an upper bound.
    pub trips: u64,
}

impl Loops {
    /// No loop.
    pub const NONE: Loops = Loops { statements: 0, trips: 0 };

    /// A loop of at most `n` iterations, each running `body`.
    pub fn of(n: u64, body: Loops) -> Loops {
        Loops {
            statements: 1 + body.statements,
            trips: n.saturating_add(1).saturating_add(n.saturating_mul(body.trips)),
        }
    }

    /// A loop of at most `n` iterations with no loop inside.
    pub fn flat(n: u64) -> Loops {
        Loops::of(n, Loops::NONE)
    }

    /// `self`, then `next`.
    pub fn then(self, next: Loops) -> Loops {
        Loops {
            statements: self.statements + next.statements,
            trips: self.trips.saturating_add(next.trips),
        }
    }

    /// `self` or `other`, whichever runs (two branches): both are written, the longer counts.
    pub fn or(self, other: Loops) -> Loops {
        Loops {
            statements: self.statements + other.statements,
            trips: self.trips.max(other.trips),
        }
    }

    /// `calls` calls of a function with these loops, its statements counted where it is
    /// defined ([`Loops::defines`]).
    pub fn calls(self, calls: u64) -> Loops {
        Loops { statements: 0, trips: self.trips.saturating_mul(calls) }
    }

    /// The statements of a function with these loops, its runs counted where it is called
    /// ([`Loops::calls`]).
    pub fn defines(self) -> Loops {
        Loops { statements: self.statements, trips: 0 }
    }

    /// The loops of one of several programs that one invocation may be: the most of each.
    pub fn max(self, other: Loops) -> Loops {
        Loops {
            statements: self.statements.max(other.statements),
            trips: self.trips.max(other.trips),
        }
    }
}

/// Iterations of `for (var j = first; j < end; j += step)` with `first >= 0`, at most.
pub fn strided(end: u64, step: u64) -> u64 {
    end.div_ceil(step.max(1))
}

/// Iterations of `for (var s = from; s > 0u; s >>= 1u)` (and of a binary search over `from`
/// elements): one per bit of `from`.
pub fn halvings(from: u64) -> u64 {
    u64::from(u64::BITS - from.leading_zeros())
}

/// Refuse kernel `k` when one of its `programs` could run more than `limit` loop iterations in
/// an invocation: an error naming the kernel's op, its operands' sizes and the bound, that
/// says to run on the CPU.
pub fn check(g: &Graph, k: &Kernel, programs: &[(Program, Loops)], limit: u64) -> Result<()> {
    let Some((p, most)) = programs.iter().find(|(_, l)| l.trips > limit) else { return Ok(()) };
    let id = match k.kind {
        KernelKind::MatMul { matmul, .. } => matmul,
        _ => *k.outputs.last().unwrap_or(&k.fused[0]),
    };
    let node = g.node(id);
    let op = node.op.name();
    let operands: Vec<String> =
        node.inputs.iter().map(|&x| format!("{}{}", g.dtype(x), fmt_shape(g.shape(x)))).collect();
    Err(err!(
        Device,
        "`{op}` of {} needs up to {} loop iterations in one GPU invocation (`{}`), and this \
         software adapter (Mesa's lavapipe or llvmpipe) ends every loop of an invocation after \
         {limit} without a word, which would give wrong results; run this model with \
         `--device cpu`",
        operands.join(", "),
        most.trips,
        p.label
    )
    .at(node.span))
}

/// The loops of the product of one matmul program on `tile` over `k` of K (the template's
/// entry points, the SIMT, dot and cooperative kernels), whose epilogue, a function, has the
/// loops `epilogue` (`identity`: the epilogue returns the product unchanged).
pub fn matmul_product(tile: MatmulTile, k: u64, (epilogue, identity): (Loops, bool)) -> Loops {
    let (bm, bn, bk, tm, tn) = tile.shape();
    let (bm, bn, bk, tm, tn) = (bm as u64, bn as u64, bk as u64, tm as u64, tn as u64);
    let slices = k.div_ceil(bk.max(1));
    let epi = |calls: u64| epilogue.calls(calls);
    let loops = match tile {
        // `shaders/matmul.wgsl`, `main`: staging loops, then per slice the staging of the next
        // and BK steps of register products; each thread's TM x TN elements stored.
        MatmulTile::Large | MatmulTile::Small => {
            let threads = (bm / tm) * (bn / tn);
            let (la, lb) = (bm * bk / threads, bk * bn / threads);
            let (tm4, tn4) = (tm / 4, tn / 4);
            let loads = Loops::flat(tm4).then(Loops::flat(tn4));
            let step = loads.then(Loops::of(tm4, Loops::flat(tn4)));
            let stage = Loops::flat(la).then(Loops::flat(lb));
            let slice = stage.then(stage).then(Loops::of(bk, step));
            let store = Loops::of(tm4, Loops::of(4, Loops::of(tn4, Loops::of(4, epi(1)))));
            stage.then(Loops::of(slices, slice)).then(store)
        }
        // `main_reg`, `main_reg8`: one loop over K, then `store_row` (a loop of 4 stores) for
        // each of the thread's rows.
        MatmulTile::Register | MatmulTile::Register8 => {
            let store_row = Loops::of(4, epi(1));
            Loops::flat(k).then(store_row.calls(tm)).then(store_row.defines())
        }
        // `matmul_simt.rs`: the slices' loop (the steps unrolled), TM x TN stores.
        MatmulTile::Simt(t) => {
            Loops::flat(k.div_ceil(u64::from(t.bk))).then(epi(u64::from(t.tm * t.tn)))
        }
        // `matmul_dot.rs`: K across the lanes, two rounds of sums, one store.
        MatmulTile::Dot => {
            let groups = u64::from(DOT_LANES / (DOT_BLOCK * DOT_BLOCK));
            Loops::flat(strided(k, u64::from(DOT_LANES)))
                .then(Loops::flat(groups))
                .then(Loops::flat(groups))
                .then(epi(1))
        }
        MatmulTile::Coop(kernel) => coop_product(&kernel, k, (epilogue, identity)),
    };
    loops.then(epilogue.defines())
}

/// `matmul_coop.rs`: the slices' loop around the 16-deep steps; emulated, every cooperative
/// operation is a function with loops over the invocation's share of a fragment (and the
/// multiply-add a 16-deep loop the driver cannot unroll). A product without an epilogue
/// (`medium`, or `high` up to `DIRECT_HIGH_MAX_K`) also stores fragments straight into C.
fn coop_product(k: &CoopKernel, depth: u64, (epilogue, identity): (Loops, bool)) -> Loops {
    let t = k.tile;
    let (fm, fnn) = (u64::from(t.bm / t.wm / 16), u64::from(t.bn / t.wn / 16));
    let frags = fm * fnn;
    let high = k.mode == CoopMode::High;
    let slices = depth.div_ceil(u64::from(t.bk));
    let steps = u64::from(t.bk / 16);
    // Each element of this invocation's share of a fragment stored through the epilogue.
    let elements = frags * u64::from(256 / k.subgroup);
    if !k.emulate {
        let main = Loops::of(slices, Loops::flat(steps));
        return main.then(epilogue.calls(elements));
    }
    let e = u64::from(256 / k.subgroup);
    let mma = Loops::of(e, Loops::flat(16));
    let each = Loops::flat(e);
    // The multiply-add functions: one per pair of staging buffers (hi·hi, and with `high`
    // hi·lo and lo·hi).
    let pairs: u32 = if high { 3 } else { 1 };
    let per_step = if high {
        mma.calls(3 * frags).then(each.calls(frags))
    } else {
        mma.calls(frags)
    };
    let main = Loops::of(slices, Loops::of(steps, per_step));
    // After the loop: `high` adds the scaled cross products; then the direct store or the
    // scratch path (both written: a conservative sum), each element through the epilogue.
    let after = if high { each.calls(2 * frags) } else { Loops::NONE };
    let stores = each.calls(2 * frags).then(epilogue.calls(elements));
    let short = depth <= u64::from(super::matmul_coop::DIRECT_HIGH_MAX_K);
    let direct = identity && (!high || short);
    let functions = Loops {
        statements: pairs * mma.statements + if high { 2 } else { 0 } + 1 + u32::from(direct),
        trips: 0,
    };
    main.then(after).then(stores).then(functions)
}

/// `coop_convert.rs`: a grid-stride loop over the strips of A and B (at most `strips`, over at
/// least `groups` workgroups), each walked twice by the workgroup (units of 8 halves, at most
/// `units` a strip) around a tree of 256 threads; with `sums` a loop over the strip's 16
/// columns of B.
pub fn coop_conversion(k: &CoopKernel, [batch, m, n, depth]: [u64; 4], sums: bool) -> Loops {
    let t = k.tile;
    let pad = |x: u64, b: u32| x.div_ceil(u64::from(b)) * u64::from(b);
    let (mp, np, kp) = (pad(m, t.bm), pad(n, t.bn), pad(depth, t.bk));
    // A strip is STRIP rows (or columns) of its operand: STRIP / 8 units a row along K, or
    // STRIP rows of units of 8 along K.
    let units = u64::from(STRIP) * mp.max(np).max(kp) / 8;
    let walk = Loops::flat(strided(units, 256));
    let side = walk.then(Loops::flat(halvings(128))).then(walk);
    let b_side = if sums { side.then(Loops::flat(8)) } else { side };
    // The strips per workgroup: at most 8192 workgroups share them, but never fewer strips
    // than workgroups; any batch of strips a workgroup takes is walked one by one.
    let strips = batch.saturating_mul(mp + np) / u64::from(STRIP);
    let per_group = strips.div_ceil(strips.clamp(1, 8192));
    Loops::of(per_group, side.or(b_side))
}

/// `matmul.rs`'s split-K sum over `m x n` (with `sums`: a loop over B's column sums too) whose
/// epilogue has the loops `epilogue`.
pub fn split_k_sum((m, n): (u64, u64), sums: bool, epilogue: Loops) -> Loops {
    let mn = m * n;
    let lanes = if mn.is_multiple_of(4) { 4 } else { 1 };
    let vectors = mn / lanes;
    let wg = u64::from(super::wgsl::WG);
    let workgroups = vectors.div_ceil(wg).clamp(1, u64::from(super::matmul::SUM_WORKGROUPS));
    let stride = workgroups * wg;
    let rounds = Loops::of(vectors.div_ceil(stride), epilogue.calls(lanes));
    let columns = if sums { Loops::flat(strided(n, stride)) } else { Loops::NONE };
    columns.then(rounds).then(epilogue.defines())
}

/// The kernels a product reported as run on the matmul kernel `name` (`KernelPrograms::matmul`)
/// may be on `target`: the fp32 tile of that name, or every tile of a cooperative mode (the
/// forced one too), emulated where the target emulates them.
pub fn tiles_named(name: &str, target: &super::Target) -> Vec<MatmulTile> {
    if let Some(&(_, tile)) = super::matmul::FP32_TILES.iter().find(|(n, _)| *n == name) {
        return vec![tile];
    }
    let mode = match name {
        "coop-high" => CoopMode::High,
        "coop-medium" => CoopMode::Medium,
        _ => return Vec::new(),
    };
    let (subgroup, emulate) = match (target.cooperative, target.matmul.emulate_coop) {
        (Some(sg), false) => (sg, false),
        _ => (32, true),
    };
    let mut tiles = super::matmul_coop::tiles(mode);
    tiles.extend(target.matmul.coop_tile);
    let kernel = |tile| MatmulTile::Coop(CoopKernel { mode, tile, subgroup, emulate });
    tiles.into_iter().map(kernel).collect()
}

/// The most loop iterations of any program of a matmul kernel of `batch x m x n x k` (the
/// product unsplit, its conversion, its split-K sum) on `tile` whose epilogue has the loops
/// `epilogue`: the bound of each of its programs that is not a generated one.
pub fn matmul_kernel(tile: MatmulTile, [batch, m, n, k]: [u64; 4], epilogue: Loops) -> Loops {
    let product = matmul_product(tile, k, (epilogue, false));
    let conversion = match tile {
        MatmulTile::Coop(kernel) => coop_conversion(&kernel, [batch, m, n, k], true),
        _ => Loops::NONE,
    };
    product.max(conversion).max(split_k_sum((m, n), true, epilogue))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A loop of n iterations costs n + 1; nested loops multiply; sequences add; calls count
    /// the function's runs where it is called and its statements once.
    #[test]
    fn loops_count_as_the_software_adapters_count() {
        assert_eq!(Loops::flat(10), Loops { statements: 1, trips: 11 });
        // 20 outer iterations, each a loop of 4: 21 + 20 * 5.
        assert_eq!(Loops::of(20, Loops::flat(4)), Loops { statements: 2, trips: 121 });
        let two = Loops::flat(40_000).then(Loops::flat(40_000));
        assert_eq!(two, Loops { statements: 2, trips: 80_002 });
        let f = Loops::flat(3);
        let used = Loops::flat(2).then(f.calls(5)).then(f.defines());
        assert_eq!(used, Loops { statements: 2, trips: 3 + 20 });
        assert_eq!(Loops::flat(u64::MAX).trips, u64::MAX);
        assert_eq!(Loops::flat(9).or(Loops::flat(2)), Loops { statements: 2, trips: 10 });
    }

    #[test]
    fn strides_and_halvings() {
        assert_eq!(strided(0, 64), 0);
        assert_eq!(strided(64, 64), 1);
        assert_eq!(strided(65, 64), 2);
        // 128, 64, ..., 1.
        assert_eq!(halvings(128), 8);
        assert_eq!(halvings(1), 1);
        assert_eq!(halvings(0), 0);
    }
}
