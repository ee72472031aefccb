"""Count the imports in src/tether that climb from a lower layer to a higher one, and find package cycles.

    python tools/check_layers.py            # prints the climbing imports and any cycle; exit 1 above the limit
    python tools/check_layers.py --graph    # also the package -> package import counts

The layer order is docs/design.md's section "Layout and layer order" (keep the two in step). A
"unit" is a package directly under `tether` (`tether.rollout`, ...) or a top-level module
(`tether.types`). Every import counts, wherever it is written: module level, inside a function
(a lazy import) or under `if TYPE_CHECKING:`. An import of a unit in a higher layer than the
importing one "climbs"; imports within one layer are allowed, but no two units may import each
other, directly or through others (a package-level cycle). Exit status 1 when more than
`--max-climbs` imports climb or any cycle exists.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

# low -> high; a unit may import its own layer and the layers below it
LAYERS: list[tuple[str, ...]] = [
    ("errors", "registry", "types", "phase", "runtime", "section", "settings", "config_text", "hardware", "configs"),
    ("algos", "optim"),
    ("policy",),
    ("tasks", "data", "rewards"),
    ("envs",),
    ("io", "runs"),
    ("health",),
    ("train", "serve"),
    ("rollout",),
    ("eval",),
    ("dist",),
    ("config",),
    ("preflight", "preflight_stages", "config_fit"),
    ("recipes",),
    ("api", "sweep_prepare", "sweep_metrics", "sweep", "report", "plan"),
    ("commands",),
    ("cli", "__init__"),
]
MAX_CLIMBS = 6
ROOT = Path(__file__).resolve().parents[1] / "src" / "tether"


def unit_of(module: str, root: Path = ROOT) -> str | None:
    """`tether.rollout.runner` -> `rollout`; `tether` -> `__init__`; None outside tether."""
    parts = module.split(".")
    if parts[0] != "tether":
        return None
    return parts[1] if len(parts) > 1 else "__init__"


def module_name(path: Path, root: Path = ROOT) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join(["tether", *parts])


def imported_modules(tree: ast.AST, module: str, is_package: bool, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, module) for every import of a tether module, lazy and TYPE_CHECKING ones included;
    `from tether import cli` names the module `tether.cli` when it is one."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "tether")
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "tether":
                continue
            for a in node.names:
                sub = f"{target}.{a.name}"
                sub_path = root.parent / Path(*sub.split("."))
                out.append((node.lineno, sub if sub_path.is_dir() or sub_path.with_suffix(".py").is_file() else target))
    return out


def collect_edges(root: Path = ROOT) -> list[tuple[str, int, str, str, str]]:
    """(file, line, from unit, to unit, imported module) for every cross-unit import under `root`."""
    edges = []
    for path in sorted(root.rglob("*.py")):
        module = module_name(path, root)
        src = unit_of(module, root) or ""
        if src == "__init__" and path.parent != root:
            continue
        src = path.stem if path.parent == root else path.relative_to(root).parts[0]
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for line, target in sorted(set(imported_modules(tree, module, path.name == "__init__.py", root))):
            dst = unit_of(target, root)
            if dst is not None and dst != src:
                edges.append((str(path.relative_to(root.parent.parent)), line, src, dst, target))
    return edges


def layer_index() -> dict[str, int]:
    return {u: i for i, layer in enumerate(LAYERS) for u in layer}


def find_climbs(edges, layers: dict[str, int]) -> list[tuple[str, int, str, str, str]]:
    return [e for e in edges if layers[e[3]] > layers[e[2]]]


def find_unplaced(edges, layers: dict[str, int], root: Path = ROOT) -> list[str]:
    units = {p.stem if p.parent == root else p.relative_to(root).parts[0] for p in root.rglob("*.py")}
    units |= {e[3] for e in edges}
    return sorted(u for u in units if u not in layers)


def find_cycles(edges) -> list[list[str]]:
    """Strongly connected components of more than one unit (Tarjan)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for e in edges:
        graph[e[2]].add(e[3])
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-climbs", type=int, default=MAX_CLIMBS)
    ap.add_argument("--graph", action="store_true", help="print the package -> package import counts")
    args = ap.parse_args(argv)
    edges = collect_edges()
    layers = layer_index()
    unplaced = find_unplaced(edges, layers)
    if unplaced:
        print(f"not in any layer: {', '.join(unplaced)}; add each to LAYERS in tools/check_layers.py (the lowest "
              "layer that holds everything it imports) and to the table in docs/design.md, \"Layout and layer order\"")
        return 1
    if args.graph:
        counts: dict[tuple[str, str], int] = defaultdict(int)
        for e in edges:
            counts[(e[2], e[3])] += 1
        for (a, b), n in sorted(counts.items()):
            print(f"{a:>14} -> {b:<14} {n}")
    climbs = find_climbs(edges, layers)
    for f, line, a, b, target in climbs:
        print(f"climbs: {f}:{line}  {a} (layer {layers[a]}) -> {target} (layer {layers[b]})")
    cycles = find_cycles(edges)
    for c in cycles:
        print(f"package cycle: {' <-> '.join(c)}")
    print(f"{len(climbs)} import(s) climb (limit {args.max_climbs}); {len(cycles)} package cycle(s)")
    return 1 if len(climbs) > args.max_climbs or cycles else 0


if __name__ == "__main__":
    sys.exit(main())
