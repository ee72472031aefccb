"""The layer order of src/tether (docs/design.md, "Layout and layer order") and the seams it keeps:
at most 6 imports climb to a higher layer, no package-level import cycle (lazy imports included),
envs/ imports no policy module, health/ and dist/ no recipe, only rollout/ asks what kind a task is,
and only the data-source registry names a data source."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src" / "tether"


def _tool():
    spec = importlib.util.spec_from_file_location("check_layers", REPO / "tools" / "check_layers.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


LAYERS = _tool()
EDGES = LAYERS.collect_edges(SRC)


def test_at_most_six_imports_climb_and_no_package_cycle(capsys):
    assert LAYERS.main([]) == 0, capsys.readouterr().out
    layers = LAYERS.layer_index()
    assert len(LAYERS.find_climbs(EDGES, layers)) <= 6 and LAYERS.find_cycles(EDGES) == []
    assert not LAYERS.find_unplaced(EDGES, layers)


def test_the_checker_counts_lazy_imports_and_finds_a_cycle(tmp_path):
    pkg = tmp_path / "tether"
    (pkg / "low").mkdir(parents=True)
    (pkg / "high").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "low" / "__init__.py").write_text("def f():\n    from tether.high import g  # lazy, still counted\n")
    (pkg / "high" / "__init__.py").write_text("from tether import low\n\ndef g():\n    pass\n")
    edges = LAYERS.collect_edges(pkg)
    assert {(e[2], e[3]) for e in edges} == {("low", "high"), ("high", "low")}
    assert LAYERS.find_cycles(edges) == [["high", "low"]]
    assert len(LAYERS.find_climbs(edges, {"low": 0, "high": 1})) == 1


def _imports(src: str, dst: str) -> list[str]:
    return [f"{e[0]}:{e[1]} imports {e[4]}" for e in EDGES if e[2] == src and e[3] == dst]


@pytest.mark.parametrize("src, dst", [("envs", "policy"), ("health", "recipes"), ("dist", "recipes")])
def test_lower_packages_do_not_import_the_higher_ones(src, dst):
    assert _imports(src, dst) == []


def _modules(exclude: tuple[str, ...]):
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if not rel.startswith(exclude):
            yield rel, ast.parse(path.read_text(encoding="utf-8"))


# what asks the kind of a task: the episode/single-turn question, the environment registry by task
# name, whether a task is a data source; rollout/ owns it (envs/ and tasks/ are the registries)
TASK_KIND = {"is_episode_task", "is_file_task", "ENVS", "SOURCES"}


def test_no_module_outside_rollout_branches_on_the_task_kind():
    found = []
    for rel, tree in _modules(("rollout/", "envs/", "tasks/")):
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id in TASK_KIND:
                found.append(f"{rel}:{node.lineno} {node.id}")
            if isinstance(node, ast.Compare) and any(_is_task(x) for x in [node.left, *node.comparators]) \
                    and not any(isinstance(x, ast.Name) and x.id == "TASKS" for x in node.comparators):
                found.append(f"{rel}:{node.lineno} compares the task")
    assert found == []


def _is_task(node: ast.AST) -> bool:
    """`data.task` of a config (`cfg.data.task`, `data.task`, `d.task`)."""
    if not (isinstance(node, ast.Attribute) and node.attr == "task"):
        return False
    owner = node.value
    return (isinstance(owner, ast.Attribute) and owner.attr == "data") or (isinstance(owner, ast.Name) and owner.id in ("data", "d"))


SOURCE_NAMES = re.compile(r"^(jsonl|hf)$")


def test_no_module_outside_the_data_registry_tests_the_data_source():
    found = []
    for rel, tree in _modules(("tasks/sources.py",)):
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                names = [x.value for x in [node.left, *node.comparators] if isinstance(x, ast.Constant)]
                names += [e.value for x in node.comparators if isinstance(x, (ast.Tuple, ast.List, ast.Set))
                          for e in x.elts if isinstance(e, ast.Constant)]
                if any(isinstance(v, str) and SOURCE_NAMES.match(v) for v in names):
                    found.append(f"{rel}:{node.lineno}")
    assert found == []


# docs/design.md, "Layout and layer order": the numeric kernels and the declarations of user settings
MORE_THAN_8 = {
    "policy/lean_train.py::layer_forward", "policy/lean_train.py::stack_forward", "policy/decode.py::step_math",
    "policy/attention.py::tether_attention", "policy/prefix.py::compute_logprobs_shared",
    "policy/prefix.py::compute_sequence_logprobs", "policy/prefix.py::_hf_hidden", "policy/prefix.py::_lean_hidden",
    "policy/scoring.py::compute_logprobs", "policy/kv_reuse.py::save_rows", "train/update.py::compute_microbatch_loss",
    "commands/health.py::faultbench", "commands/analysis.py::plan", "commands/analysis.py::fit",
    "commands/sweep.py::sweep", "commands/tinker.py::serve_tinker", "rewards/judge.py::judge",
}


def _parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = fn.args
    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
    return len(names) - (names[:1] in (["self"], ["cls"])) + bool(a.vararg) + bool(a.kwarg)


def test_no_function_takes_more_than_8_parameters_but_the_documented():
    over = {f"{rel}::{node.name}" for rel, tree in _modules(()) for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _parameters(node) > 8}
    assert over <= MORE_THAN_8, sorted(over - MORE_THAN_8)
    design = (REPO / "docs" / "design.md").read_text(encoding="utf-8")
    assert all(name.split("::")[1] in design for name in MORE_THAN_8)
