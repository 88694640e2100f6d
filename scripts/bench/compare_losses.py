"""Compare training-loss trajectories of precision modes against a reference mode.

Each argument is `LABEL=FILE`, FILE a JSON object with a `losses` list (the last JSON line of
`rumus bench FILE --json`, or one line of `LOSSES=1 torch_baselines.py`); the first is the
reference. Prints, for every other trajectory, the largest relative difference |l - ref| / |ref|
over all steps, the step where it occurs, and the first step where it exceeds 1e-4 and 1e-2:

    python3 scripts/bench/compare_losses.py highest=h.json high=hi.json medium=m.json
"""
import json, sys

def losses(path):
    for line in reversed(open(path).read().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            obj = json.loads(line)
            if "losses" in obj:
                return obj["losses"]
    sys.exit(f"{path}: no JSON line with `losses`")

runs = [(a.split("=", 1)[0], losses(a.split("=", 1)[1])) for a in sys.argv[1:]]
(ref_name, ref), rest = runs[0], runs[1:]
for name, ls in rest:
    rel = [abs(a - b) / abs(b) for a, b in zip(ls, ref)]
    worst = max(range(len(rel)), key=rel.__getitem__)
    first = lambda t: next((i for i, r in enumerate(rel) if r > t), None)
    print(json.dumps(dict(run=name, against=ref_name, steps=len(rel), max_rel=rel[worst],
                          at_step=worst, first_over_1e4=first(1e-4), first_over_1e2=first(1e-2))))
