// layer_norm.wgsl: layer normalization over the last axis, forward.
//
//   mean = sum_j x[r, j] / D,   rstd = 1 / sqrt(sum_j (x[r, j] - mean)^2 / D + eps)
//   y[r, j] = (x[r, j] - mean) * rstd * weight[j] + bias[j],   stats[r] = (mean, rstd)
//
// One workgroup of WG threads per row (the row id is linear over the grid, x + nx * (y + ny * z),
// so more than 65535 rows can be split into a 2-D grid). Thread t holds columns t + c * WG,
// c < CPT, in registers: x is read from memory once, mean and variance are two exact passes over
// the registers, each summed across the workgroup in two levels (NG groups of WG / NG) so a
// reduction costs two barriers. Arithmetic is f32 whatever `scalar` is; stats are always f32.
//
// Bindings: 0 params, 1 x [rows, D], 2 weight [D], 3 bias [D], 4 y [rows, D], 5 stats [rows, 2].
//
// Placeholders: <CPT> columns per thread, ceil(D / WG) (default 4, i.e. D <= 1024).

alias scalar = f32;

struct Params {
    rows: u32,
    d: u32,
    eps: f32,
    pad0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<scalar>;
@group(0) @binding(2) var<storage, read> weight: array<scalar>;
@group(0) @binding(3) var<storage, read> bias: array<scalar>;
@group(0) @binding(4) var<storage, read_write> y: array<scalar>;
@group(0) @binding(5) var<storage, read_write> stats: array<f32>;

const WG: u32 = 256u;
const NG: u32 = 16u;
const CPT: u32 = {{CPT}}u;

var<workgroup> red: array<f32, WG>;
var<workgroup> red_groups: array<f32, NG>;

// Sum of `v` over the workgroup, returned to every thread. Must be called in uniform control flow.
fn workgroup_sum(v: f32, t: u32) -> f32 {
    red[t] = v;
    workgroupBarrier();
    if t < NG {
        var s = 0.0;
        for (var i = 0u; i < WG / NG; i++) {
            s += red[t * (WG / NG) + i];
        }
        red_groups[t] = s;
    }
    workgroupBarrier();
    var total = 0.0;
    for (var i = 0u; i < NG; i++) {
        total += red_groups[i];
    }
    return total;
}

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    let row = wid.x + nwg.x * (wid.y + nwg.y * wid.z);
    if row >= p.rows {
        return;
    }
    let base = row * p.d;
    let inv_d = 1.0 / f32(p.d);
    var xs: array<f32, CPT>;
    var s = 0.0;
    for (var c = 0u; c < CPT; c++) {
        let j = t + c * WG;
        var v = 0.0;
        if j < p.d {
            v = f32(x[base + j]);
        }
        xs[c] = v;
        s += v;
    }
    let mean = workgroup_sum(s, t) * inv_d;
    var q = 0.0;
    for (var c = 0u; c < CPT; c++) {
        if t + c * WG < p.d {
            let dv = xs[c] - mean;
            q += dv * dv;
        }
    }
    let rstd = inverseSqrt(workgroup_sum(q, t) * inv_d + p.eps);
    for (var c = 0u; c < CPT; c++) {
        let j = t + c * WG;
        if j < p.d {
            y[base + j] = scalar((xs[c] - mean) * rstd * f32(weight[j]) + f32(bias[j]));
        }
    }
    if t == 0u {
        stats[2u * row] = mean;
        stats[2u * row + 1u] = rstd;
    }
}
