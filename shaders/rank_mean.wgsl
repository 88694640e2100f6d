// The mean over the ranks of a data-parallel job of one bucket of gradients
// (`runtime/exchange.rs`): `slots` holds `ranks` copies of `n` values, rank k's at `k * n`; the
// mean is written over slot 0, summed in rank order and then scaled by `inv` (1 / ranks,
// computed by the host), so every rank computes the same bits.

alias scalar = f32;

struct Params {
    n: u32,
    ranks: u32,
    inv: scalar,
    pad: u32,
}

@group(0) @binding(0) var<storage, read_write> slots: array<scalar>;
@group(0) @binding(1) var<uniform> p: Params;

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nw: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let i = (wg.x + nw.x * (wg.y + nw.y * wg.z)) * 256u + li;
    if (i >= p.n) {
        return;
    }
    var sum = slots[i];
    for (var k = 1u; k < p.ranks; k++) {
        sum += slots[k * p.n + i];
    }
    slots[i] = sum * p.inv;
}
