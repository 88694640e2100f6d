#!/usr/bin/env python3
"""Where a step's time goes, per dispatch and per matmul shape.

Reads the JSON of `rumus bench FILE --device gpu --profile --json` (one object, or the last
line of the output) and prints the TOP slowest dispatches, then the matmul dispatches summed
per shape and stage (product, conversion, split-K sum; and for profiles of binaries before
2026-12-01's per-strip exponents the range pre-pass and its finish), with the product's
TFLOP/s where the label names its shape. Stages no dispatch of the profile has are left out.

    python3 scripts/bench/profile_top.py bench.json [TOP]

Labels look like `matmul #812 4096x768x3072 coop-high convert`: kind, output node, the shape
(`BxMxNxK` when batched), the tile, then the stage for a pre-pass; a merged dispatch joins its
parts' labels with ` + ` and is counted apart (one time for all its parts).
"""

import json
import re
import sys
from collections import defaultdict

SHAPE = re.compile(r"^(?:(\d+)x)?(\d+)x(\d+)x(\d+)$")
STAGES = ("range finish", "range", "convert", "split-k sum")


def load(path):
    text = open(path).read().strip()
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    raise SystemExit(f"{path}: no JSON object found")


def parse(label):
    """(shape words, tile, stage) of a matmul label; None for other kinds and for merged
    dispatches (labels joined by ` + `: several kernels' programs timed as one)."""
    if " + " in label:
        return None
    words = label.split(" ")
    if words[0] != "matmul" or len(words) < 4:
        return None
    m = SHAPE.match(words[2])
    if not m:
        return None
    rest = " ".join(words[3:])
    stage = "product"
    for s in STAGES:
        if rest.endswith(" " + s) or rest == s:
            stage = s
            rest = rest[: -len(s)].strip()
            break
    split = re.search(r"split-k (\d+)", rest)
    b, mm, n, k = (int(x) if x else 1 for x in m.groups())
    if split and stage == "product":
        # The partial products: `splits` batches of K / splits.
        s = int(split.group(1))
        b, k = s, k // s
    return (b, mm, n, k), rest, stage


def main():
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    data = load(sys.argv[1])
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 25
    rows = [(d["label"], d["ms"]) for d in data.get("profile_dispatches", [])]
    if not rows:
        raise SystemExit("no profile_dispatches: run `rumus bench` with --profile --json")
    total = sum(ms for _, ms in rows)
    print(f"{data.get('model')} {data.get('matmul_precision')}: step {data.get('step_ms_median'):.3f} ms "
          f"median; {len(rows)} dispatches, {total:.3f} ms profiled one by one")
    print(f"\ntop {top} dispatches")
    for label, ms in sorted(rows, key=lambda r: -r[1])[:top]:
        print(f"  {ms:8.3f} ms  {label}")

    shapes = defaultdict(lambda: defaultdict(lambda: [0.0, 0]))
    flops = {}
    products = {}
    for label, _ in rows:
        p = parse(label)
        if p is not None and p[2] == "product":
            products[label.split(" ")[1]] = (p[0], p[1])
    for label, ms in rows:
        p = parse(label)
        if p is None:
            continue
        (b, m, n, k), tile, stage = p
        # The pre-passes and the split-K sum count with the product they serve.
        (b, m, n, k), tile = products.get(label.split(" ")[1], ((b, m, n, k), tile))
        key = (f"{b}x{m}x{n}x{k}" if b > 1 else f"{m}x{n}x{k}", tile)
        slot = shapes[key][stage]
        slot[0] += ms
        slot[1] += 1
        if stage == "product":
            flops[key] = flops.get(key, 0.0) + 2.0 * b * m * n * k
    merged = [(label, ms) for label, ms in rows if " + " in label]
    if merged:
        ms = sum(ms for _, ms in merged)
        print(f"\nmerged dispatches (labels joined by ` + `, left out of the shapes below): "
              f"{len(merged)}, {ms:.3f} ms")
    if not shapes:
        return
    every = ["product", "range", "range finish", "convert", "split-k sum"]
    cols = [c for c in every if any(c in stages for stages in shapes.values())]
    print("\nmatmul per shape and tile: ms (dispatches) per stage; TFLOP/s of the products")
    print(f"  {'shape':<18} {'tile':<22} {'total':>8} " + " ".join(f"{c:>16}" for c in cols) + "   TFLOP/s")
    order = sorted(shapes.items(), key=lambda kv: -sum(v[0] for v in kv[1].values()))
    matmul_ms = 0.0
    for (shape, tile), stages in order:
        t = sum(v[0] for v in stages.values())
        matmul_ms += t
        cells = []
        for c in cols:
            ms, n = stages.get(c, [0.0, 0])
            cells.append(f"{ms:9.3f} ({n:3d})" if n else f"{'':>16}")
        prod = stages.get("product", [0.0, 0])[0]
        tf = flops.get((shape, tile), 0.0) / (prod * 1e-3) / 1e12 if prod > 0 else 0.0
        print(f"  {shape:<18} {tile:<22} {t:8.3f} " + " ".join(cells) + f"   {tf:7.1f}")
    print(f"  matmul total {matmul_ms:.3f} ms of {total:.3f}")


if __name__ == "__main__":
    main()
