// matmul.wgsl: batched, strided matrix product with a fusable epilogue.
//
//   C[b, i, j] = epilogue(alpha * sum_k A[b, i, k] * B[b, k, j], b, i, j) + beta * C[b, i, j]
//
// Every operand is addressed through an element offset and (batch, row, col) strides from `p`,
// so a transposed operand (swapped strides) or a broadcast batch (batch stride 0) needs no copy.
// Any M, N, K: loads outside the matrices read 0 and stores are bounds-checked. beta == 0 never
// reads C, so C may hold anything (NaN) before the dispatch.
//
// Grid: x = ceil(N / BN), y = ceil(M / BM), z = batch. A workgroup computes one BM x BN block of C,
// stepping through K in BK-deep slices staged in workgroup memory (A slice stored k-major, rows
// padded by 4 so staging stores do not conflict). Each of the (BM/TM)*(BN/TN) threads keeps a
// TM x TN tile of C in registers; the next slice is loaded into registers while the current one
// is multiplied. Thread (tx, ty) owns rows r*4*TY + ty*4 + e (r < TM/4, e < 4) and likewise columns,
// so its reads of workgroup memory are vec4s that neighbouring threads take side by side.
// Global loads walk whichever axis of an operand has stride 1, so they coalesce for both plain
// and transposed operands.
//
// Placeholders (defaults in src/codegen/templates.rs):
//   <BM> <BN> <BK> <TM> <TN>  tile shape; TM and TN multiples of 4; BM*BK and BK*BN
//                                       multiples of the thread count (BM/TM)*(BN/TN)
//   <EPILOGUE_BINDINGS>  extra bindings the epilogue reads (from @binding(4) on), default none
//   <EPILOGUE>           body of `epilogue(v, batch, i, j) -> scalar`, default `return v;`

alias scalar = f32;

struct Params {
    m: u32, n: u32, k: u32, batch: u32,
    a_off: u32, a_sb: u32, a_si: u32, a_sk: u32,
    b_off: u32, b_sb: u32, b_sk: u32, b_sj: u32,
    c_off: u32, c_sb: u32, c_si: u32, c_sj: u32,
    alpha: f32, beta: f32, pad0: u32, pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> a: array<scalar>;
@group(0) @binding(2) var<storage, read> b: array<scalar>;
@group(0) @binding(3) var<storage, read_write> c: array<scalar>;
{{EPILOGUE_BINDINGS}}

const BM: u32 = {{BM}}u;
const BN: u32 = {{BN}}u;
const BK: u32 = {{BK}}u;
const TM: u32 = {{TM}}u;
const TN: u32 = {{TN}}u;
const TX: u32 = BN / TN;            // threads along columns
const TY: u32 = BM / TM;            // threads along rows
const THREADS: u32 = TX * TY;
const TM4: u32 = TM / 4u;
const TN4: u32 = TN / 4u;
const AS: u32 = BM + 4u;            // stride of one k in the staged A slice, in scalars
const BS: u32 = BN + 4u;            // stride of one k in the staged B slice
const LA: u32 = BM * BK / THREADS;  // A elements each thread stages per slice
const LB: u32 = BK * BN / THREADS;  // B elements each thread stages per slice

var<workgroup> sa: array<vec4<scalar>, BK * AS / 4u>;
var<workgroup> sb: array<vec4<scalar>, BK * BS / 4u>;

fn epilogue(v: scalar, batch: u32, i: u32, j: u32) -> scalar {
    {{EPILOGUE}}
}

// (row, k) inside the A slice of staged element `e`; consecutive e walk the contiguous axis.
fn a_coord(e: u32, k_contiguous: bool) -> vec2<u32> {
    if k_contiguous {
        return vec2<u32>(e / BK, e % BK);
    }
    return vec2<u32>(e % BM, e / BM);
}

// (k, col) inside the B slice of staged element `e`.
fn b_coord(e: u32, k_contiguous: bool) -> vec2<u32> {
    if k_contiguous {
        return vec2<u32>(e % BK, e / BK);
    }
    return vec2<u32>(e / BN, e % BN);
}

fn load_a(base: u32, rc: vec2<u32>, k0: u32) -> scalar {
    let i = rc.x;
    let kk = k0 + rc.y;
    if i < p.m && kk < p.k {
        return a[base + i * p.a_si + kk * p.a_sk];
    }
    return scalar(0.0);
}

fn load_b(base: u32, kc: vec2<u32>, k0: u32) -> scalar {
    let kk = k0 + kc.x;
    let j = kc.y;
    if kk < p.k && j < p.n {
        return b[base + kk * p.b_sk + j * p.b_sj];
    }
    return scalar(0.0);
}

@compute @workgroup_size(THREADS)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let batch = wid.z;
    let row0 = wid.y * BM;
    let col0 = wid.x * BN;
    let tx = t % TX;
    let ty = t / TX;
    let a_base = p.a_off + batch * p.a_sb;
    let b_base = p.b_off + batch * p.b_sb;
    let a_kc = p.a_sk == 1u && p.a_si != 1u;
    let b_kc = p.b_sk == 1u && p.b_sj != 1u;

    var ra: array<scalar, LA>;
    var rb: array<scalar, LB>;
    var acc: array<vec4<scalar>, TM * TN4>;
    for (var e = 0u; e < LA; e++) {
        let rc = a_coord(t + e * THREADS, a_kc);
        ra[e] = load_a(a_base, vec2<u32>(row0 + rc.x, rc.y), 0u);
    }
    for (var e = 0u; e < LB; e++) {
        let kc = b_coord(t + e * THREADS, b_kc);
        rb[e] = load_b(b_base, vec2<u32>(kc.x, col0 + kc.y), 0u);
    }

    let n_slices = (p.k + BK - 1u) / BK;
    for (var s = 0u; s < n_slices; s++) {
        for (var e = 0u; e < LA; e++) {
            let rc = a_coord(t + e * THREADS, a_kc);
            let f = rc.y * AS + rc.x;
            sa[f / 4u][f % 4u] = ra[e];
        }
        for (var e = 0u; e < LB; e++) {
            let kc = b_coord(t + e * THREADS, b_kc);
            let f = kc.x * BS + kc.y;
            sb[f / 4u][f % 4u] = rb[e];
        }
        workgroupBarrier();

        if s + 1u < n_slices {
            let k0 = (s + 1u) * BK;
            for (var e = 0u; e < LA; e++) {
                let rc = a_coord(t + e * THREADS, a_kc);
                ra[e] = load_a(a_base, vec2<u32>(row0 + rc.x, rc.y), k0);
            }
            for (var e = 0u; e < LB; e++) {
                let kc = b_coord(t + e * THREADS, b_kc);
                rb[e] = load_b(b_base, vec2<u32>(kc.x, col0 + kc.y), k0);
            }
        }

        for (var kk = 0u; kk < BK; kk++) {
            var fa: array<vec4<scalar>, TM4>;
            var fb: array<vec4<scalar>, TN4>;
            for (var r = 0u; r < TM4; r++) {
                fa[r] = sa[kk * (AS / 4u) + r * TY + ty];
            }
            for (var q = 0u; q < TN4; q++) {
                fb[q] = sb[kk * (BS / 4u) + q * TX + tx];
            }
            for (var r = 0u; r < TM4; r++) {
                let av = fa[r];
                let o = r * 4u * TN4;
                for (var q = 0u; q < TN4; q++) {
                    let bv = fb[q];
                    acc[o + q] += av.x * bv;
                    acc[o + TN4 + q] += av.y * bv;
                    acc[o + 2u * TN4 + q] += av.z * bv;
                    acc[o + 3u * TN4 + q] += av.w * bv;
                }
            }
        }
        workgroupBarrier();
    }

    let alpha = scalar(p.alpha);
    let beta = scalar(p.beta);
    let c_base = p.c_off + batch * p.c_sb;
    for (var r = 0u; r < TM4; r++) {
        for (var e = 0u; e < 4u; e++) {
            let i = row0 + r * 4u * TY + ty * 4u + e;
            if i >= p.m {
                continue;
            }
            for (var q = 0u; q < TN4; q++) {
                let v = acc[(r * 4u + e) * TN4 + q];
                for (var cc = 0u; cc < 4u; cc++) {
                    let j = col0 + q * 4u * TX + tx * 4u + cc;
                    if j < p.n {
                        let idx = c_base + i * p.c_si + j * p.c_sj;
                        var y = epilogue(alpha * v[cc], batch, i, j);
                        if p.beta != 0.0 {
                            y += beta * c[idx];
                        }
                        c[idx] = y;
                    }
                }
            }
        }
    }
}

// `main_reg`: no workgroup memory and no barriers. Each thread of a 16 x 16 workgroup keeps a
// 4 x 4 block of C in four vec4 registers and reads A and B straight from memory (the caches
// serve the reuse), so a workgroup covers 64 x 64 of C. Loads at the ragged edges are clamped
// into range and their results never stored.
@compute @workgroup_size(16, 16)
fn main_reg(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let batch = wid.z;
    let i0 = (wid.y * 16u + lid.y) * 4u;
    let j0 = (wid.x * 16u + lid.x) * 4u;
    if i0 >= p.m || j0 >= p.n {
        return;
    }
    let a_base = p.a_off + batch * p.a_sb;
    let b_base = p.b_off + batch * p.b_sb;
    let r0 = a_base + i0 * p.a_si;
    let r1 = a_base + min(i0 + 1u, p.m - 1u) * p.a_si;
    let r2 = a_base + min(i0 + 2u, p.m - 1u) * p.a_si;
    let r3 = a_base + min(i0 + 3u, p.m - 1u) * p.a_si;
    let c0 = b_base + j0 * p.b_sj;
    let c1 = b_base + min(j0 + 1u, p.n - 1u) * p.b_sj;
    let c2 = b_base + min(j0 + 2u, p.n - 1u) * p.b_sj;
    let c3 = b_base + min(j0 + 3u, p.n - 1u) * p.b_sj;
    var acc0 = vec4<scalar>(0.0);
    var acc1 = vec4<scalar>(0.0);
    var acc2 = vec4<scalar>(0.0);
    var acc3 = vec4<scalar>(0.0);
    for (var k = 0u; k < p.k; k++) {
        let ka = k * p.a_sk;
        let kb = k * p.b_sk;
        let bv = vec4<scalar>(b[c0 + kb], b[c1 + kb], b[c2 + kb], b[c3 + kb]);
        acc0 += a[r0 + ka] * bv;
        acc1 += a[r1 + ka] * bv;
        acc2 += a[r2 + ka] * bv;
        acc3 += a[r3 + ka] * bv;
    }
    store_row(acc0, batch, i0, j0);
    store_row(acc1, batch, i0 + 1u, j0);
    store_row(acc2, batch, i0 + 2u, j0);
    store_row(acc3, batch, i0 + 3u, j0);
}

// `main_reg8`: as `main_reg` with an 8 x 4 block per thread (eight vec4 accumulators), so each
// k step does 32 multiply-adds for 12 loads; a 16 x 16 workgroup covers 128 x 64 of C.
@compute @workgroup_size(16, 16)
fn main_reg8(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let batch = wid.z;
    let i0 = (wid.y * 16u + lid.y) * 8u;
    let j0 = (wid.x * 16u + lid.x) * 4u;
    if i0 >= p.m || j0 >= p.n {
        return;
    }
    let a_base = p.a_off + batch * p.a_sb;
    let b_base = p.b_off + batch * p.b_sb;
    let last = p.m - 1u;
    let r0 = a_base + i0 * p.a_si;
    let r1 = a_base + min(i0 + 1u, last) * p.a_si;
    let r2 = a_base + min(i0 + 2u, last) * p.a_si;
    let r3 = a_base + min(i0 + 3u, last) * p.a_si;
    let r4 = a_base + min(i0 + 4u, last) * p.a_si;
    let r5 = a_base + min(i0 + 5u, last) * p.a_si;
    let r6 = a_base + min(i0 + 6u, last) * p.a_si;
    let r7 = a_base + min(i0 + 7u, last) * p.a_si;
    let c0 = b_base + j0 * p.b_sj;
    let c1 = b_base + min(j0 + 1u, p.n - 1u) * p.b_sj;
    let c2 = b_base + min(j0 + 2u, p.n - 1u) * p.b_sj;
    let c3 = b_base + min(j0 + 3u, p.n - 1u) * p.b_sj;
    var acc0 = vec4<scalar>(0.0);
    var acc1 = vec4<scalar>(0.0);
    var acc2 = vec4<scalar>(0.0);
    var acc3 = vec4<scalar>(0.0);
    var acc4 = vec4<scalar>(0.0);
    var acc5 = vec4<scalar>(0.0);
    var acc6 = vec4<scalar>(0.0);
    var acc7 = vec4<scalar>(0.0);
    for (var k = 0u; k < p.k; k++) {
        let ka = k * p.a_sk;
        let kb = k * p.b_sk;
        let bv = vec4<scalar>(b[c0 + kb], b[c1 + kb], b[c2 + kb], b[c3 + kb]);
        acc0 += a[r0 + ka] * bv;
        acc1 += a[r1 + ka] * bv;
        acc2 += a[r2 + ka] * bv;
        acc3 += a[r3 + ka] * bv;
        acc4 += a[r4 + ka] * bv;
        acc5 += a[r5 + ka] * bv;
        acc6 += a[r6 + ka] * bv;
        acc7 += a[r7 + ka] * bv;
    }
    store_row(acc0, batch, i0, j0);
    store_row(acc1, batch, i0 + 1u, j0);
    store_row(acc2, batch, i0 + 2u, j0);
    store_row(acc3, batch, i0 + 3u, j0);
    store_row(acc4, batch, i0 + 4u, j0);
    store_row(acc5, batch, i0 + 5u, j0);
    store_row(acc6, batch, i0 + 6u, j0);
    store_row(acc7, batch, i0 + 7u, j0);
}

// Four consecutive elements of row `i` of C from column `j0`, through the epilogue and beta.
fn store_row(v: vec4<scalar>, batch: u32, i: u32, j0: u32) {
    if i >= p.m {
        return;
    }
    let c_base = p.c_off + batch * p.c_sb + i * p.c_si;
    for (var cc = 0u; cc < 4u; cc++) {
        let j = j0 + cc;
        if j < p.n {
            let idx = c_base + j * p.c_sj;
            var y = epilogue(scalar(p.alpha) * v[cc], batch, i, j);
            if p.beta != 0.0 {
                y += scalar(p.beta) * c[idx];
            }
            c[idx] = y;
        }
    }
}
