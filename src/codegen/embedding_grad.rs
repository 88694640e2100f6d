//! Embedding backward, deterministic in O(N·D + V·D) for N indices into a table of V rows of
//! D: the indices are sorted by row with a stable least-significant-digit radix sort (8 bits a
//! pass, as many passes as the row numbers need), each pass three dispatches over blocks of
//! 256 indices (per-block digit counts; their exclusive scan in one workgroup; each index
//! ranked among the equal digits before it in its block and written to its place). Then each
//! row finds where its run of the sorted indices starts (a binary search), and thread
//! `(v, d)` sums `dy` over its run: its occurrences in index order, the same bits every run,
//! no float atomics. The first pass checks the indices (a bad one reads as row 0: the step
//! fails and commits nothing).
//!
//! Scratch: slots 0 and 1 the keys and positions written by even passes, 2 and 3 by odd ones,
//! 4 the block counts, 5 each row's start.

use super::gather::{check_index, in_range};
use super::loops::{halvings, Loops};
use super::wgsl::{open_main, thread_index, Binder, Ctx, WG};
use super::writer::Wgsl;
use crate::graph::{Graph, NodeId};

/// Indices a block of a radix pass holds (its workgroup's threads), and the bins of a digit.
const BLOCK: usize = 256;
/// Bits of a radix pass's digit.
const DIGIT_BITS: u32 = 8;

/// (indices, rows, width) of embedding gradient `out`.
fn sizes(g: &Graph, out: NodeId) -> (usize, usize, usize) {
    let idx = g.node(out).inputs[0];
    (g.shape(idx).iter().product(), g.shape(out)[0], g.shape(out)[1])
}

/// The scratch slot of the keys radix pass `pass` writes (its positions: the next slot).
fn written_by(pass: usize) -> usize {
    2 * (pass % 2)
}

/// Radix passes for row numbers below `rows` (at least one).
fn passes(rows: usize) -> usize {
    let bits = usize::BITS - rows.saturating_sub(1).leading_zeros();
    bits.div_ceil(DIGIT_BITS).max(1) as usize
}

/// Dispatches of embedding gradient `out`: three a radix pass, the run starts and the sums;
/// one (check the indices, write zeros) when there is nothing to sort or nothing to write.
pub(super) fn embedding_grad_stages(g: &Graph, out: NodeId) -> usize {
    let (n, rows, d) = sizes(g, out);
    if n == 0 || rows * d == 0 {
        1
    } else {
        3 * passes(rows) + 2
    }
}

pub(super) fn embedding_grad(
    g: &Graph,
    w: &mut Wgsl,
    binder: &Binder,
    ctx: &mut Ctx,
    out: NodeId,
) -> (u32, u32, Loops) {
    let node = g.node(out);
    let (idx, dy) = (node.inputs[0], node.inputs[1]);
    let (n, rows, d) = sizes(g, out);
    let (x, dn, yn) = (binder.name(idx), binder.name(dy), binder.name(out));
    let ok = in_range("r", rows);
    let n_out = rows * d;
    if n == 0 || n_out == 0 {
        open_main(w, WG);
        w.line(&format!("let i = (wid.x + wid.y * nwg.x) * {WG}u + lid;"));
        check_index(w, &x, n, &ok);
        w.block(&format!("if (i < {n_out}u)"), &[&format!("{yn}[i] = 0.0;")]);
        w.close();
        return ((n_out.max(n) as u32).div_ceil(WG), WG, Loops::NONE);
    }
    let p = passes(rows);
    let blocks = n.div_ceil(BLOCK);
    let hist_words = BLOCK * blocks;
    // The sorted keys and positions of the last pass.
    let (keys, vals) = (written_by(p - 1), written_by(p - 1) + 1);
    match ctx.stage {
        s if s < 3 * p => {
            let pass = s / 3;
            let shift = DIGIT_BITS as usize * pass;
            let hist = ctx.scratch_of(4, hist_words, "u32");
            // The key, and the position, of index `m` before this pass.
            let from = written_by(pass.saturating_sub(1));
            let key = |ctx: &mut Ctx| match pass {
                0 => format!("select(0u, u32({x}[m]), {})", in_range(&format!("{x}[m]"), rows)),
                _ => format!("{}[m]", ctx.scratch_of(from, n, "u32")),
            };
            let val = |ctx: &mut Ctx| match pass {
                0 => "m".to_string(),
                _ => format!("{}[m]", ctx.scratch_of(from + 1, n, "u32")),
            };
            match s % 3 {
                0 => {
                    w.line(&format!("var<workgroup> bins: array<atomic<u32>, {BLOCK}>;"));
                    w.blank();
                    open_main(w, BLOCK as u32);
                    w.line("let b = wid.x + wid.y * nwg.x;");
                    w.block(&format!("if (b >= {blocks}u)"), &["return;"]);
                    w.line("atomicStore(&bins[lid], 0u);");
                    w.line("workgroupBarrier();");
                    w.line(&format!("let m = b * {BLOCK}u + lid;"));
                    w.open(&format!("if (m < {n}u)"));
                    if pass == 0 {
                        w.line(&format!("let r = {x}[m];"));
                        w.block(&format!("if (!{ok})"), &["report(m);"]);
                    }
                    let key = key(ctx);
                    w.line(&format!("atomicAdd(&bins[({key} >> {shift}u) & {}u], 1u);", BLOCK - 1));
                    w.close();
                    w.line("workgroupBarrier();");
                    w.line(&format!("{hist}[lid * {blocks}u + b] = atomicLoad(&bins[lid]);"));
                    w.close();
                    (blocks as u32, BLOCK as u32, Loops::NONE)
                }
                1 => {
                    // The exclusive scan of the counts, digit-major: thread t scans its stretch.
                    let per = hist_words.div_ceil(BLOCK);
                    w.line(&format!("var<workgroup> part: array<u32, {BLOCK}>;"));
                    w.blank();
                    open_main(w, BLOCK as u32);
                    w.line(&format!("let lo = lid * {per}u;"));
                    w.line(&format!("let hi = min(lo + {per}u, {hist_words}u);"));
                    w.line("var run = 0u;");
                    w.block("for (var i = lo; i < hi; i++)", &[&format!("run += {hist}[i];")]);
                    w.line("part[lid] = run;");
                    w.line("workgroupBarrier();");
                    w.open("if (lid == 0u)");
                    w.line("var total = 0u;");
                    w.block(
                        &format!("for (var t = 0u; t < {BLOCK}u; t++)"),
                        &["let c = part[t];", "part[t] = total;", "total += c;"],
                    );
                    w.close();
                    w.line("workgroupBarrier();");
                    w.line("run = part[lid];");
                    w.block(
                        "for (var i = lo; i < hi; i++)",
                        &[&format!("let c = {hist}[i];"), &format!("{hist}[i] = run;"), "run += c;"],
                    );
                    w.close();
                    // A stretch of the counts twice; the first thread scans the stretches.
                    let stretch = Loops::flat(per as u64);
                    (1, BLOCK as u32, stretch.then(Loops::flat(BLOCK as u64)).then(stretch))
                }
                _ => {
                    let to = written_by(pass);
                    let ko = ctx.scratch_of(to, n, "u32");
                    let vo = ctx.scratch_of(to + 1, n, "u32");
                    w.line(&format!("var<workgroup> digits: array<u32, {BLOCK}>;"));
                    w.blank();
                    open_main(w, BLOCK as u32);
                    w.line("let b = wid.x + wid.y * nwg.x;");
                    w.block(&format!("if (b >= {blocks}u)"), &["return;"]);
                    w.line(&format!("let m = b * {BLOCK}u + lid;"));
                    w.line(&format!("var digit = {BLOCK}u;"));
                    w.line("var key = 0u;");
                    w.line("var val = 0u;");
                    w.open(&format!("if (m < {n}u)"));
                    w.line(&format!("key = {};", key(ctx)));
                    w.line(&format!("val = {};", val(ctx)));
                    w.line(&format!("digit = (key >> {shift}u) & {}u;", BLOCK - 1));
                    w.close();
                    w.line("digits[lid] = digit;");
                    w.line("workgroupBarrier();");
                    w.open(&format!("if (m < {n}u)"));
                    w.line("var rank = 0u;");
                    w.block("for (var t = 0u; t < lid; t++)", &["rank += u32(digits[t] == digit);"]);
                    w.line(&format!("let at = {hist}[digit * {blocks}u + b] + rank;"));
                    w.line(&format!("{ko}[at] = key;"));
                    w.line(&format!("{vo}[at] = val;"));
                    w.close();
                    w.close();
                    // The digits of the threads before this one.
                    (blocks as u32, BLOCK as u32, Loops::flat(BLOCK as u64 - 1))
                }
            }
        }
        s if s == 3 * p => {
            // Where row v's run of the sorted keys starts (v = rows: the end).
            let k = ctx.scratch_of(keys, n, "u32");
            let start = ctx.scratch_of(5, rows + 1, "u32");
            open_main(w, WG);
            thread_index(w, "v", rows + 1);
            w.line("var lo = 0u;");
            w.line(&format!("var hi = {n}u;"));
            w.open("while (lo < hi)");
            w.line("let mid = (lo + hi) / 2u;");
            w.line(&format!("let below = {k}[mid] < v;"));
            w.line("lo = select(lo, mid + 1u, below);");
            w.line("hi = select(mid, hi, below);");
            w.close();
            w.line(&format!("{start}[v] = lo;"));
            w.close();
            // A binary search over the n keys.
            ((rows as u32 + 1).div_ceil(WG), WG, Loops::flat(halvings(n as u64)))
        }
        _ => {
            let v = ctx.scratch_of(vals, n, "u32");
            let start = ctx.scratch_of(5, rows + 1, "u32");
            let at = format!("{v}[s] * {d}u + col");
            open_main(w, WG);
            thread_index(w, "i", n_out);
            w.line(&format!("let row = i / {d}u;"));
            w.line(&format!("let col = i % {d}u;"));
            w.line("var acc = 0.0;");
            w.block(
                &format!("for (var s = {start}[row]; s < {start}[row + 1u]; s++)"),
                &[&format!("acc += {dn}[{at}];")],
            );
            w.line(&format!("{yn}[i] = acc;"));
            w.close();
            // The row's occurrences: as many as the data puts there, every index at most.
            ((n_out as u32).div_ceil(WG), WG, Loops::flat(n as u64))
        }
    }
}
