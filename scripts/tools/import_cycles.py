"""Issue 10's layering check: which top-level modules of src/ import which (`crate::X` in code,
not in comments or test modules), and any cycle between them. Prints the cycles (none: exit 0).

    python3 scripts/tools/import_cycles.py
"""
import collections, os, re, sys

deps = collections.defaultdict(set)
for root, _, files in os.walk("src"):
    for f in files:
        if not f.endswith(".rs"):
            continue
        rel = os.path.relpath(os.path.join(root, f), "src")
        top = rel.split("/")[0].removesuffix(".rs")
        code = open(os.path.join(root, f)).read().split("#[cfg(test)]")[0]
        for line in code.split("\n"):
            for m in re.finditer(r"crate::(\w+)", line.split("//")[0]):
                if m.group(1) != top:
                    deps[top].add(m.group(1))

def reach(a):
    seen, todo = set(), [a]
    while todo:
        for b in deps.get(todo.pop(), ()):
            if b not in seen:
                seen.add(b)
                todo.append(b)
    return seen

cycles = sorted({tuple(sorted((a, b))) for a in deps for b in deps[a] if a in reach(b)})
for a, b in cycles:
    print(f"cycle: {a} <-> {b}")
print(f"{len(deps)} modules, {sum(map(len, deps.values()))} imports, {len(cycles)} cycles")
sys.exit(1 if cycles else 0)
