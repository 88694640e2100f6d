// layer_norm.wgsl: layer normalization over the last axis, forward.
//
//   mean = sum_j x[r, j] / D,   rstd = 1 / sqrt(sum_j (x[r, j] - mean)^2 / D + eps)
//   y[r, j] = (x[r, j] - mean) * rstd * weight[j] + bias[j],   stats[r] = (mean, rstd)
//
// One workgroup of WG threads per row (the row id is linear over the grid, x + nx * (y + ny * z),
// so more than 65535 rows can be split into a 2-D grid); WG is sized to D. Thread t holds columns
// t + c * WG, c < CPT, in registers: x is read from memory once. Each thread takes the exact mean
// and sum of squared deviations of its own columns, and the workgroup merges these (count, mean,
// M2) triples in a fixed order with Chan's pairwise formula, in two levels (NG groups of WG / NG):
// one reduction, two barriers, without the cancellation of a sum of squares. Arithmetic is f32
// whatever `scalar` is; stats are always f32.
//
// Bindings: 0 params, 1 x [rows, D], 2 weight [D], 3 bias [D], 4 y [rows, D], 5 stats [rows, 2].
//
// Placeholders: <WG> threads per workgroup (default 256), <NG> groups of its two-level reduction
// (default 16), <CPT> columns per thread, ceil(D / WG) (default 4, i.e. D <= 1024).

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

const WG: u32 = {{WG}}u;
const NG: u32 = {{NG}}u;
const CPT: u32 = {{CPT}}u;

var<workgroup> red: array<vec3<f32>, WG>;
var<workgroup> red_groups: array<vec3<f32>, NG>;

// The (count, mean, M2) of two sets of values merged (Chan, Golub and LeVeque). An empty set
// leaves the other as it is: merged by the formula, a mean of 1e19 squared to infinity and
// times its zero weight gave NaN (a row narrower than the workgroup has empty threads).
fn merge(a: vec3<f32>, b: vec3<f32>) -> vec3<f32> {
    if b.x == 0.0 {
        return a;
    }
    if a.x == 0.0 {
        return b;
    }
    let n = a.x + b.x;
    let delta = b.y - a.y;
    let f = b.x / n;
    return vec3<f32>(n, a.y + delta * f, a.z + b.z + delta * delta * a.x * f);
}

// (count, mean, M2) of the whole row from each thread's own, returned to every thread. Must be
// called in uniform control flow.
fn workgroup_merge(v: vec3<f32>, t: u32) -> vec3<f32> {
    red[t] = v;
    workgroupBarrier();
    if t < NG {
        var s = red[t * (WG / NG)];
        for (var i = 1u; i < WG / NG; i++) {
            s = merge(s, red[t * (WG / NG) + i]);
        }
        red_groups[t] = s;
    }
    workgroupBarrier();
    var total = red_groups[0];
    for (var i = 1u; i < NG; i++) {
        total = merge(total, red_groups[i]);
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
    var xs: array<f32, CPT>;
    var s = 0.0;
    var n = 0.0;
    for (var c = 0u; c < CPT; c++) {
        let j = t + c * WG;
        var v = 0.0;
        if j < p.d {
            v = f32(x[base + j]);
            n += 1.0;
        }
        xs[c] = v;
        s += v;
    }
    let own_mean = select(0.0, s / n, n > 0.0);
    var q = 0.0;
    for (var c = 0u; c < CPT; c++) {
        if t + c * WG < p.d {
            let dv = xs[c] - own_mean;
            q += dv * dv;
        }
    }
    let whole = workgroup_merge(vec3<f32>(n, own_mean, q), t);
    let mean = whole.y;
    let rstd = inverseSqrt(whole.z / f32(p.d) + p.eps);
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
