// layer_norm_bw.wgsl: layer normalization over the last axis, backward. Two entry points.
//
// `rows`: with xhat = (x - mean) * rstd and g = dy * weight (mean, rstd from the forward stats),
//   dx = rstd * (g - mean_j(g) - xhat * mean_j(g * xhat))           (+= dx when FLAG_ACC_DX)
//   (+ addend[r, j] where <ADD> says so: a residual connection's gradient joining dx's)
// and, where <SUM> says so, the column sums of the dx it writes (a bias gradient), alongside
// dweight and dbias.
// One workgroup per group of `rows_per_group` consecutive rows; per row, both means come from one
// two-level workgroup reduction of a vec2. Thread t owns columns t + c * WG (c < CPT) for the whole
// group, so it also sums dy * xhat and dy over the group's rows in registers and finally writes
// them to partial[group, j] = (dweight part, dbias part[, dx part]): no atomics, no race.
//
// `params`: dparams[j] = dweight[j] = sum over groups of partial[g, j].x, and
// dparams[D + j] = dbias[j] likewise with .y: one [2, D] buffer, as the graph's
// layer_norm_grad_weight node holds them
// (+= when FLAG_ACC_PARAMS); where <SUM_WRITE> says so, colsum[j] likewise with .z. A workgroup of PWG threads takes PC adjacent columns; its PWG / PC
// lanes stride over the groups and are summed in workgroup memory.
//
// Bindings: 0 params; rows: 1 x, 2 weight, 3 stats [rows, 2], 4 dy, 5 dx, 6 partial [groups, D, NP],
// 8 addend [rows, D] (only where <ADD> reads it); params: 6 partial, 7 dparams [2, D], 9 colsum [D]
// (only where <SUM_WRITE> writes it). Grid: rows = one workgroup per group (linear id over
// x, y, z); params = ceil(D / PC) workgroups.
//
// Placeholders: <WG> threads per workgroup (default 256), <NG> groups of its two-level reduction
// (default 16), <CPT> columns per thread, ceil(D / WG) (default 4, i.e. D <= 1024), <ADD> a statement
// run on each dx element `v` before it is stored (default none; `v += f32(addend[base + j]);`), <NP>
// partials per (group, column) (2, or 3 with the column sums of dx), <SUM> run after <ADD> (default
// none; `ds[c] += v;`), <SUM_STORE> storing the third partial (`partial[o + 2u] = ds[c];`),
// <SUM_LOAD> loading it (default 0.0; `partial[o + 2u]`), <SUM_WRITE> storing the column sum
// (`colsum[j] = scalar(total.z);`).

alias scalar = f32;

struct Params {
    rows: u32,
    d: u32,
    rows_per_group: u32,
    flags: u32,
}

const FLAG_ACC_DX: u32 = 1u;
const FLAG_ACC_PARAMS: u32 = 2u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<scalar>;
@group(0) @binding(2) var<storage, read> weight: array<scalar>;
@group(0) @binding(3) var<storage, read> stats: array<f32>;
@group(0) @binding(4) var<storage, read> dy: array<scalar>;
@group(0) @binding(5) var<storage, read_write> dx: array<scalar>;
@group(0) @binding(6) var<storage, read_write> partial: array<f32>;
@group(0) @binding(7) var<storage, read_write> dparams: array<scalar>;
@group(0) @binding(8) var<storage, read> addend: array<scalar>;
@group(0) @binding(9) var<storage, read_write> colsum: array<scalar>;

const WG: u32 = {{WG}}u;
const NG: u32 = {{NG}}u;
const CPT: u32 = {{CPT}}u;
const PC: u32 = 8u;
const PWG: u32 = 256u;
const NP: u32 = {{NP}}u;

var<workgroup> red: array<vec2<f32>, WG>;
var<workgroup> red_groups: array<vec2<f32>, NG>;
var<workgroup> red_params: array<vec3<f32>, PWG>;

// Sum of `v` over the workgroup, returned to every thread. Must be called in uniform control flow.
fn workgroup_sum2(v: vec2<f32>, t: u32) -> vec2<f32> {
    red[t] = v;
    workgroupBarrier();
    if t < NG {
        var s = vec2<f32>(0.0);
        for (var i = 0u; i < WG / NG; i++) {
            s += red[t * (WG / NG) + i];
        }
        red_groups[t] = s;
    }
    workgroupBarrier();
    var total = vec2<f32>(0.0);
    for (var i = 0u; i < NG; i++) {
        total += red_groups[i];
    }
    return total;
}

@compute @workgroup_size(WG)
fn rows(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    let group = wid.x + nwg.x * (wid.y + nwg.y * wid.z);
    let r0 = group * p.rows_per_group;
    if r0 >= p.rows {
        return;
    }
    let r1 = min(r0 + p.rows_per_group, p.rows);
    let inv_d = 1.0 / f32(p.d);
    var w: array<f32, CPT>;
    var dw: array<f32, CPT>;
    var db: array<f32, CPT>;
    var ds: array<f32, CPT>;
    for (var c = 0u; c < CPT; c++) {
        let j = t + c * WG;
        if j < p.d {
            w[c] = f32(weight[j]);
        }
    }
    for (var r = r0; r < r1; r++) {
        let base = r * p.d;
        let mean = stats[2u * r];
        let rstd = stats[2u * r + 1u];
        var xh: array<f32, CPT>;
        var g: array<f32, CPT>;
        var s = vec2<f32>(0.0);
        for (var c = 0u; c < CPT; c++) {
            let j = t + c * WG;
            if j < p.d {
                let xv = (f32(x[base + j]) - mean) * rstd;
                let dyv = f32(dy[base + j]);
                xh[c] = xv;
                g[c] = dyv * w[c];
                s += vec2<f32>(g[c], g[c] * xv);
                dw[c] += dyv * xv;
                db[c] += dyv;
            }
        }
        let m = workgroup_sum2(s, t) * inv_d;
        for (var c = 0u; c < CPT; c++) {
            let j = t + c * WG;
            if j < p.d {
                var v = rstd * (g[c] - m.x - xh[c] * m.y);
                if (p.flags & FLAG_ACC_DX) != 0u {
                    v += f32(dx[base + j]);
                }
                {{ADD}}
                {{SUM}}
                dx[base + j] = scalar(v);
            }
        }
    }
    for (var c = 0u; c < CPT; c++) {
        let j = t + c * WG;
        if j < p.d {
            let o = NP * (group * p.d + j);
            partial[o] = dw[c];
            partial[o + 1u] = db[c];
            {{SUM_STORE}}
        }
    }
}

@compute @workgroup_size(PWG)
fn params(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let col = t % PC;
    let lane = t / PC;
    let j = wid.x * PC + col;
    let groups = (p.rows + p.rows_per_group - 1u) / p.rows_per_group;
    var s = vec3<f32>(0.0);
    if j < p.d {
        for (var g = lane; g < groups; g += PWG / PC) {
            let o = NP * (g * p.d + j);
            s += vec3<f32>(partial[o], partial[o + 1u], {{SUM_LOAD}});
        }
    }
    red_params[t] = s;
    workgroupBarrier();
    if lane == 0u && j < p.d {
        var total = vec3<f32>(0.0);
        for (var l = 0u; l < PWG / PC; l++) {
            total += red_params[l * PC + col];
        }
        if (p.flags & FLAG_ACC_PARAMS) != 0u {
            total += vec3<f32>(f32(dparams[j]), f32(dparams[p.d + j]), 0.0);
        }
        dparams[j] = scalar(total.x);
        dparams[p.d + j] = scalar(total.y);
        {{SUM_WRITE}}
    }
}
