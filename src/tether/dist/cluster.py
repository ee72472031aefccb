"""Ray: start or join a cluster, check the request against it (preflight), place the actors.

A placement group that asks for more than the cluster has makes Ray wait forever with no output
(verl#7656, docs/design.md, correctness rule 12). The preflight compares the bundles the config asks for with
the nodes Ray reports and fails at once with a message that names the shortfall and the fix;
a placement group that still does not become ready in `dist.placement.timeout_s` (resources
held by another job) fails the same way instead of hanging.

A local instance runs with token auth off (RAY_AUTH_MODE=disabled, as the Makefile sets it), a short
`_temp_dir` of its own (unix socket paths are length-limited), no dashboard, shut down (and the
temp dir removed) on exit.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from typing import Any, Iterator, Mapping, Sequence

from tether.dist.config import DistConfig


class PreflightError(RuntimeError):
    """The cluster cannot hold what the config asks for; the message names the fix."""


def compute_bundles(d: DistConfig) -> list[dict[str, float]]:
    """One bundle per rollout worker, then one per trainer rank beyond rank 0 (the driver)."""
    out = []
    for role, n, res in (("rollout", d.rollout_workers, d.placement.rollout),
                         ("trainer", d.trainer_workers - 1, d.placement.trainer)):
        if n > 0 and res.cpus <= 0 and res.gpus <= 0:
            raise PreflightError(f"dist.placement.{role} asks for 0 CPUs and 0 GPUs; Ray bundles need a resource")
        bundle = {k: v for k, v in (("CPU", res.cpus), ("GPU", res.gpus)) if v > 0}
        out.extend(dict(bundle) for _ in range(n))
    return out


def _fits(bundle: Mapping[str, float], free: Mapping[str, float]) -> bool:
    return all(free.get(k, 0.0) + 1e-9 >= v for k, v in bundle.items())


def compute_placement_problem(bundles: Sequence[Mapping[str, float]], nodes: Sequence[Mapping[str, float]],
                              strategy: str) -> str:
    """'' when the bundles can be placed on `nodes` (per-node resources) under `strategy`, else why not.

    First-fit decreasing; STRICT_PACK needs one node for all, STRICT_SPREAD a node per bundle.
    """
    if not bundles:
        return ""
    total = {k: sum(b.get(k, 0.0) for b in bundles) for k in ("CPU", "GPU")}
    have = {k: sum(n.get(k, 0.0) for n in nodes) for k in ("CPU", "GPU")}
    short = [f"{total[k] - have[k]:g} {k}" for k in ("CPU", "GPU") if total[k] > have[k] + 1e-9]
    if short:
        return f"the cluster is short of {' and '.join(short)}"
    if strategy == "STRICT_PACK":
        return "" if any(_fits(total, n) for n in nodes) else "STRICT_PACK needs one node that holds every bundle"
    if strategy == "STRICT_SPREAD" and len(bundles) > len(nodes):
        return f"STRICT_SPREAD needs a node per bundle ({len(bundles)} bundles, {len(nodes)} nodes)"
    free = [dict(n) for n in nodes]
    order = sorted(bundles, key=lambda b: (-b.get("GPU", 0.0), -b.get("CPU", 0.0)))
    used: set[int] = set()
    for b in order:
        spots = [i for i, f in enumerate(free) if _fits(b, f) and not (strategy == "STRICT_SPREAD" and i in used)]
        if not spots:
            return f"no node has room for a bundle of {_fmt(b)} once the others are placed"
        i = spots[0]
        used.add(i)
        for k, v in b.items():
            free[i][k] = free[i].get(k, 0.0) - v
    return ""


def _fmt(res: Mapping[str, float]) -> str:
    return ", ".join(f"{v:g} {k}" for k, v in res.items() if k in ("CPU", "GPU")) or "nothing"


def format_preflight_error(d: DistConfig, bundles: Sequence[Mapping[str, float]], nodes: Sequence[Mapping[str, float]],
                           problem: str) -> str:
    r, t = d.placement.rollout, d.placement.trainer
    asks = (f"{d.rollout_workers} rollout worker(s) x ({r.cpus:g} CPU, {r.gpus:g} GPU)"
            + (f" + {d.trainer_workers - 1} trainer rank(s) x ({t.cpus:g} CPU, {t.gpus:g} GPU)" if d.trainer_workers > 1 else ""))
    total = {k: sum(b.get(k, 0.0) for b in bundles) for k in ("CPU", "GPU")}
    cluster = "; ".join(f"node {i}: {_fmt(n)}" for i, n in enumerate(nodes)) or "no nodes"
    return (f"dist preflight: the run asks for {asks} = {_fmt(total)} in {len(bundles)} bundles "
            f"({d.placement.strategy}), but {problem} ({cluster}). Ray would wait for these resources forever "
            f"(verl#7656). Fix: lower dist.rollout_workers / dist.placement.rollout.cpus / dist.placement.rollout.gpus, "
            f"set dist.num_cpus for a local instance, or add nodes with `ray start --address=<head-ip>:6379`.")


def list_node_resources() -> list[dict[str, float]]:
    """Total resources of every live node of the connected cluster."""
    import ray

    return [dict(n["Resources"]) for n in ray.nodes() if n.get("Alive", True)]


def do_preflight(d: DistConfig) -> list[dict[str, float]]:
    """Raise PreflightError when the config's bundles cannot be placed; returns the bundles."""
    bundles = compute_bundles(d)
    nodes = list_node_resources()
    problem = compute_placement_problem(bundles, nodes, d.placement.strategy)
    if problem:
        raise PreflightError(format_preflight_error(d, bundles, nodes, problem))
    return bundles


def make_placement_group(d: DistConfig, bundles: Sequence[Mapping[str, float]]):
    """A ready placement group, or PreflightError after `dist.placement.timeout_s`."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    pg = placement_group([dict(b) for b in bundles], strategy=d.placement.strategy)
    try:
        ray.get(pg.ready(), timeout=d.placement.timeout_s)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(pg)
        raise PreflightError(
            f"dist preflight: the placement group of {len(bundles)} bundles ({d.placement.strategy}) was not ready "
            f"after {d.placement.timeout_s:g}s although the cluster's totals suffice: other jobs hold the resources "
            f"(available now: {_fmt(ray.available_resources())}). Free them or lower the request.") from None
    return pg


def make_actor_options(pg, index: int, res) -> dict[str, Any]:
    """Ray options that pin an actor to bundle `index` of `pg` with the bundle's resources."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return {"num_cpus": res.cpus, "num_gpus": res.gpus, "max_restarts": 0, "max_concurrency": 1,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=index)}


@contextlib.contextmanager
def start_cluster(d: DistConfig) -> Iterator[None]:
    """Connect to `dist.ray_address`, or start a local instance; preflight; disconnect on exit.

    A Ray connection that already exists (a notebook, a test fixture) is used and left open.
    """
    import ray

    if ray.is_initialized():
        do_preflight(d)
        yield
        return
    temp = None
    if d.ray_address is None:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        temp = tempfile.mkdtemp(prefix="tether-ray-", dir="/tmp")
        ray.init(num_cpus=d.num_cpus, include_dashboard=False, _temp_dir=temp, configure_logging=False,
                 log_to_driver=True)
    else:
        ray.init(address=d.ray_address, configure_logging=False, log_to_driver=True)
    try:
        do_preflight(d)
        yield
    finally:
        ray.shutdown()
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)


__all__ = ["PreflightError", "make_actor_options", "compute_bundles", "compute_placement_problem", "do_preflight",
           "format_preflight_error", "make_placement_group", "start_cluster"]
