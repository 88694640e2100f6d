//! Offset assignment: the values that share memory placed at byte offsets inside a few large
//! buffers (*heaps*), so that the bytes planned approach the most bytes ever alive at once.
//!
//! Giving each value a whole buffer wastes what a smaller value leaves of a larger buffer it
//! reuses; here a value takes only its own bytes, anywhere in a heap where no value alive at the
//! same time lies. The placement is the greedy-by-size heuristic of TFLite's and XLA's heap
//! simulators: largest value first, each at the offset of the tightest gap between the values
//! already placed that are alive when it is (best fit), or where its heap grows least.
//!
//! Two constraints come from the device:
//! - wgpu refuses a dispatch that binds one buffer both read-only and writable, whatever the
//!   ranges, so two values that one kernel reads one of and writes the other (`apart`) never
//!   share a heap: a kernel's outputs and inputs are in different heaps;
//! - a heap is at most `cap` bytes (`max_buffer_size`), and every value starts at a multiple of
//!   [`ALIGN_BYTES`] (a storage binding's offset alignment).

use super::alloc::Lifetime;

/// Bytes between the starts of values in a heap: 256, the largest
/// `min_storage_buffer_offset_alignment` WebGPU allows.
pub const ALIGN_BYTES: u64 = 256;

/// The most groups [`place`] tries.
pub const MOST_GROUPS: usize = 12;

/// A value to place.
#[derive(Clone, Copy, Debug)]
pub struct Item {
    /// Its size (placed rounded up to [`ALIGN_BYTES`]).
    pub bytes: u64,
    /// The kernels during which its bytes are in use.
    pub lifetime: Lifetime,
}

/// Where the items went: the heaps' sizes, and each item's heap and offset in bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Each heap's size in bytes.
    pub heaps: Vec<u64>,
    /// Each item's heap (an index into `heaps`) and byte offset in it, in the items' order.
    pub at: Vec<(usize, u64)>,
}

/// Place `items`: each gets a range of a heap that no item with an overlapping lifetime holds,
/// in a heap that no item of its `apart` list is in. A heap grows past `cap` only to hold one
/// item alone. The items are first split into groups none of which holds two items apart
/// ([`groups`]), each group in heaps of its own; of the splits into 1 to [`MOST_GROUPS`] groups
/// (or more where the constraints need them), the one with the fewest bytes in all is kept, and
/// of those the one with the most heaps.
/// (Measured on the GPT benchmarks: more groups balanced over time leave less of each heap
/// unused; gpt-medium's heaps came to its live peak with 8. Its training graph with clipping,
/// the test `heaps_come_close_to_the_live_peak`, needed more once the attention backward
/// lost its `delta` values: 2.7% over the peak with at most 8 groups, 1.7% with at most 12
/// (the best split: 10 heaps).)
pub fn place(items: &[Item], apart: &[Vec<usize>], cap: u64) -> Layout {
    let total = |l: &Layout| l.heaps.iter().sum::<u64>();
    // Largest first; ties by first use, then index, so the layout is deterministic.
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(items[i].bytes), items[i].lifetime.first, i));
    let candidates =
        (1..=MOST_GROUPS).map(|n| place_in_groups(items, &order, &groups(items, apart, &order, n), cap));
    // Of splits with equal bytes, the one with the most heaps: the layout alone moved
    // gpt-medium's `high` step on the H200 by 9% (6 heaps 64.6 ms, 8 59.1, 9 and 10 60.1; one
    // set of values, kernels and bytes); the cause is not known. Fewer heaps won no tie that
    // was measured by more than 2% (`medium`: 37.4 against 38.1).
    let fewer_bytes_then_more_heaps =
        |a: &Layout, b: &Layout| total(a).cmp(&total(b)).then(b.heaps.len().cmp(&a.heaps.len()));
    candidates.min_by(fewer_bytes_then_more_heaps).expect("at least one split")
}

/// Split `items`, taken in `order`, into at least `n` groups (more where the `apart` constraints need them) such
/// that no group holds two items apart, balancing the groups' bytes over time: each item
/// into the allowed group whose peak of live bytes grows least (then the one
/// with the fewest live bytes during the item's lifetime). The peaks of the groups then come
/// close to the peak of all the items, which their heaps are sized by.
pub fn groups(items: &[Item], apart: &[Vec<usize>], order: &[usize], n: usize) -> Vec<usize> {
    // Live bytes per group per step of time (lifetimes shifted so the first is at 0), each a
    // tree answering an interval's largest load in log time (a list of the steps made this
    // quadratic: `rumus plan` of a 400-layer GPT spent 40% of its 3 s here).
    let t0 = items.iter().map(|i| i.lifetime.first).min().unwrap_or(0);
    let t1 = items.iter().map(|i| i.lifetime.last).max().unwrap_or(0);
    let span = |i: &Item| ((i.lifetime.first - t0) as usize, (i.lifetime.last - t0) as usize);
    let steps = (t1 - t0 + 1).max(1) as usize;
    let mut load: Vec<MaxTree> = (0..n).map(|_| MaxTree::new(steps)).collect();
    let mut group = vec![usize::MAX; items.len()];
    for &v in order {
        let bytes = items[v].bytes;
        let (a, b) = span(&items[v]);
        let mut best: Option<(u64, u64, usize)> = None; // (growth, busiest, group)
        for (c, l) in load.iter().enumerate() {
            if apart[v].iter().any(|&u| group[u] == c) {
                continue;
            }
            let busiest = l.max(a, b);
            let key = ((busiest + bytes).saturating_sub(l.peak()), busiest, c);
            if best.is_none_or(|b| key < b) {
                best = Some(key);
            }
        }
        let c = match best {
            Some((_, _, c)) => c,
            None => {
                load.push(MaxTree::new(steps));
                load.len() - 1
            }
        };
        load[c].add(a, b, bytes);
        group[v] = c;
    }
    group
}

/// Loads over steps `0..n`: add to an interval, the largest load in an interval, the largest
/// of all, each in log time (a segment tree whose nodes keep their range's largest load and
/// what was added to the whole range).
struct MaxTree {
    n: usize,
    /// Per node: the largest load in its range, counting what was added at it and below.
    max: Vec<u64>,
    /// Per node: what was added to its whole range.
    added: Vec<u64>,
}

impl MaxTree {
    fn new(n: usize) -> MaxTree {
        MaxTree { n, max: vec![0; 4 * n], added: vec![0; 4 * n] }
    }

    /// The largest load of all steps.
    fn peak(&self) -> u64 {
        self.max[1]
    }

    /// Add `v` to steps `a..=b`.
    fn add(&mut self, a: usize, b: usize, v: u64) {
        self.add_at(1, 0, self.n - 1, a, b, v);
    }

    fn add_at(&mut self, node: usize, lo: usize, hi: usize, a: usize, b: usize, v: u64) {
        if b < lo || hi < a {
            return;
        }
        if a <= lo && hi <= b {
            self.max[node] += v;
            self.added[node] += v;
            return;
        }
        let mid = (lo + hi) / 2;
        self.add_at(2 * node, lo, mid, a, b, v);
        self.add_at(2 * node + 1, mid + 1, hi, a, b, v);
        self.max[node] = self.added[node] + self.max[2 * node].max(self.max[2 * node + 1]);
    }

    /// The largest load of steps `a..=b`.
    fn max(&self, a: usize, b: usize) -> u64 {
        self.max_at(1, 0, self.n - 1, a, b)
    }

    fn max_at(&self, node: usize, lo: usize, hi: usize, a: usize, b: usize) -> u64 {
        if b < lo || hi < a {
            return 0;
        }
        if a <= lo && hi <= b {
            return self.max[node];
        }
        let mid = (lo + hi) / 2;
        let below = self.max_at(2 * node, lo, mid, a, b).max(self.max_at(2 * node + 1, mid + 1, hi, a, b));
        self.added[node] + below
    }
}

/// Place `items`, in `order`, in heaps, each heap holding items of one group (`group[i]`, from [`groups`]).
fn place_in_groups(items: &[Item], order: &[usize], group: &[usize], cap: u64) -> Layout {
    let reserved = |i: usize| items[i].bytes.div_ceil(ALIGN_BYTES) * ALIGN_BYTES;
    let mut heaps: Vec<u64> = Vec::new();
    let mut heap_group: Vec<usize> = Vec::new();
    let mut members: Vec<Vec<usize>> = Vec::new();
    let mut at: Vec<Option<(usize, u64)>> = vec![None; items.len()];
    for &v in order {
        let size = reserved(v);
        let lifetime = items[v].lifetime;
        // (growth, gap, heap, offset), the least growth first, then the tightest gap.
        let mut best: Option<(u64, u64, usize, u64)> = None;
        for h in (0..heaps.len()).filter(|&h| heap_group[h] == group[v]) {
            let mut busy: Vec<(u64, u64)> = (members[h].iter())
                .filter(|&&u| items[u].lifetime.overlaps(lifetime))
                .map(|&u| {
                    let start = at[u].expect("a member is placed").1;
                    (start, start + reserved(u))
                })
                .collect();
            busy.sort_unstable();
            let mut end = 0; // of the ranges below the gap looked at
            let mut fit: Option<(u64, u64)> = None; // (gap, offset), the tightest
            for &(start, stop) in &busy {
                if start >= end + size && fit.is_none_or(|f| start - end < f.0) {
                    fit = Some((start - end, end));
                }
                end = end.max(stop);
            }
            if heaps[h] >= end + size && fit.is_none_or(|f| heaps[h] - end < f.0) {
                fit = Some((heaps[h] - end, end));
            }
            // No gap holds it: past the last range alive, growing the heap.
            let (growth, gap, offset) = match fit {
                Some((gap, offset)) => (0, gap, offset),
                None => (end + size - heaps[h], 0, end),
            };
            if growth > 0 && offset + size > cap {
                continue;
            }
            let key = (growth, gap, h, offset);
            if best.is_none_or(|b| key < b) {
                best = Some(key);
            }
        }
        let (h, offset) = match best {
            Some((_, _, h, offset)) => (h, offset),
            None => {
                heaps.push(0);
                heap_group.push(group[v]);
                members.push(Vec::new());
                (heaps.len() - 1, 0)
            }
        };
        heaps[h] = heaps[h].max(offset + size);
        members[h].push(v);
        at[v] = Some((h, offset));
    }
    Layout { heaps, at: at.into_iter().map(|a| a.expect("every item is placed")).collect() }
}

#[cfg(test)]
mod tests {
    use super::{place, Item, Layout, MaxTree, ALIGN_BYTES};
    use crate::plan::Lifetime;

    /// The tree's interval maxima and peak equal a list's, over adds of pseudo-random
    /// intervals (sizes 1 to 37, a power of two and not).
    #[test]
    fn the_load_tree_answers_as_a_list_of_steps_does() {
        let mut x = 12345u64;
        let mut next = |m: usize| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (x >> 33) as usize % m
        };
        for n in [1, 2, 7, 16, 37] {
            let (mut tree, mut list) = (MaxTree::new(n), vec![0u64; n]);
            for _ in 0..200 {
                let (a, b) = (next(n), next(n));
                let (a, b) = (a.min(b), a.max(b));
                let v = next(1000) as u64;
                tree.add(a, b, v);
                list[a..=b].iter_mut().for_each(|l| *l += v);
                let (c, d) = (next(n), next(n));
                let (c, d) = (c.min(d), c.max(d));
                assert_eq!(tree.max(c, d), *list[c..=d].iter().max().unwrap(), "n {n}");
                assert_eq!(tree.peak(), *list.iter().max().unwrap(), "n {n}");
            }
        }
    }

    fn item(bytes: u64, first: i64, last: i64) -> Item {
        Item { bytes, lifetime: Lifetime { first, last } }
    }

    #[test]
    fn values_alive_apart_share_offsets_and_gaps_are_filled() {
        let k = ALIGN_BYTES;
        let check = |items: &[Item], apart: &[Vec<usize>], cap: u64, want: Layout| {
            assert_eq!(place(items, apart, cap), want, "{items:?} {apart:?}");
        };
        let none = |n: usize| vec![Vec::new(); n];
        // Disjoint lifetimes: one range serves both.
        check(&[item(k, 0, 1), item(k, 2, 3)], &none(2), u64::MAX, Layout { heaps: vec![k], at: vec![(0, 0), (0, 0)] });
        // Overlapping: side by side (sizes round up to the alignment), or, the same bytes in
        // more heaps, each in its own.
        let apart_heaps = Layout { heaps: vec![k, k], at: vec![(1, 0), (0, 0)] };
        check(&[item(4, 0, 1), item(8, 1, 2)], &none(2), u64::MAX, apart_heaps);
        // A small value takes the gap a large one left when it died, not new bytes (the
        // middle one in a heap of its own: the same bytes as side by side, more heaps).
        check(
            &[item(4 * k, 0, 1), item(2 * k, 0, 5), item(3 * k, 2, 5)],
            &none(3),
            u64::MAX,
            Layout { heaps: vec![4 * k, 2 * k], at: vec![(0, 0), (1, 0), (0, 0)] },
        );
        // Read by one kernel that writes the other: separate heaps, even when they could share.
        check(
            &[item(k, 0, 1), item(k, 2, 3)],
            &[vec![1], vec![0]],
            u64::MAX,
            Layout { heaps: vec![k, k], at: vec![(0, 0), (1, 0)] },
        );
        // A heap stops at the cap; an item larger than the cap gets a heap of its own.
        check(&[item(k, 0, 1), item(k, 0, 1)], &none(2), k, Layout { heaps: vec![k, k], at: vec![(0, 0), (1, 0)] });
        check(&[item(3 * k, 0, 1)], &none(1), k, Layout { heaps: vec![3 * k], at: vec![(0, 0)] });
    }
}
