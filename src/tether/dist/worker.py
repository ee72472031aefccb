"""A rollout worker: one policy copy (+ environments + rewards) that turns orders into groups.

A plain class; `tether.dist.controller` runs it as a Ray actor (`ray.remote(RolloutWorker)`), and
tests can run it in-process. The rollout itself is the synchronous recipe's own
`tether.rollout.collect_groups` over a small worker-side state (`tether.rollout.WorkerState`), so
rollouts, rewards, dynamic sampling and multi-turn environments behave exactly as in `tether train`;
the worker never imports a recipe.

Weight-sync handshake (docs/design.md, correctness rule 4): `load_weights(version, arrays, checksum, probe)`
loads the arrays, recomputes the checksum from what the model now HOLDS, and only then adopts
`version` — a mismatch leaves the worker at its old version and says so. It then scores the probe
sequence with the rollout engine and returns those log-probs, which the trainer compares with
its own (dist.sync.probe_tol). An order names the oldest version allowed to serve it
(admission control); a worker below it refuses the order instead of producing stale samples.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import torch

from tether.policy.weights import compute_checksum, from_numpy_state, make_publish_state, to_numpy_state


class StaleWorkerError(RuntimeError):
    """An order reached a worker whose confirmed weights are older than the order allows."""


class FixedStream:
    """A ProblemStream stand-in that hands out the problems the controller drew for an order."""

    def __init__(self, problems: Sequence[Mapping[str, Any]]) -> None:
        self.problems, self.position = list(problems), 0

    def next_batch(self, k: int) -> list[Mapping[str, Any]]:
        out = self.problems[self.position:self.position + k]
        self.position += len(out)
        if not out:
            raise RuntimeError("rollout order exhausted its problems (dynamic sampling asked for another round)")
        return out


@dataclass
class Order:
    """One unit of rollout work: a shard of the batch the trainer consumes at `batch_version`."""

    batch_version: int
    shard: int
    problems: list[Mapping[str, Any]]
    cfg: Any  # TetherConfig (sampling, rewards, envs, dynamic sampling as the trainer has them now)
    min_version: int  # admission control: the oldest weights allowed to serve it
    generator_state: torch.Tensor | None = None  # sequential mode: the trainer's RNG, handed over and back
    stream_state: dict[str, int] | None = None  # sequential mode: the trainer's data position
    attempt: int = 0
    meta: dict[str, Any] = field(default_factory=dict)


SUMMED = frozenset({"rollout/gen_tokens", "rollout/prompts_skipped", "reward/seconds", "dynamic_sampling/shortfall",
                    *(f"env/{k}" for k in ("episodes", "env_errors", "step_timeouts", "tool_calls", "tool_errors",
                                           "tool_timeouts", "parse_errors", "summaries", "summary_errors"))})


def merge_metrics(parts: Sequence[tuple[Mapping[str, float], float]]) -> dict[str, float]:
    """Combine the metrics of several rollout calls, each with a weight (its number of samples):
    counts and times add up, maxima and minima stay extreme, the rest is a weighted mean."""
    out: dict[str, float] = {}
    wsum: dict[str, float] = {}
    for m, w in parts:
        for k, v in m.items():
            v = float(v)
            if k.startswith("time/") or k.endswith("_count") or k in SUMMED:
                out[k] = out.get(k, 0.0) + v
            elif k.endswith(("_max", "/max", "/rounds")):
                out[k] = max(out.get(k, v), v)
            elif k.endswith(("_min", "/min")):
                out[k] = min(out.get(k, v), v)
            else:
                out[k] = out.get(k, 0.0) + v * w
                wsum[k] = wsum.get(k, 0.0) + w
    for k, w in wsum.items():
        out[k] = out[k] / w if w > 0 else 0.0
    return out


class RolloutWorker:
    """See the module docstring. Construct with the model bundle (`tether.policy.weights`)."""

    def __init__(self, index: int, bundle: Mapping[str, Any], cfg: Any, seed: int, device: str = "cpu",
                 train_problems: Sequence[Mapping[str, Any]] | None = None, threads: int | None = None) -> None:
        torch.set_num_threads(max(1, threads or 1))
        import importlib

        import tether.envs  # noqa: F401  (registers the built-in environments as tasks)

        for module in cfg.dist.worker_imports:  # user registrations live in the driver's process only
            importlib.import_module(module)
        self.index, self.cfg = index, cfg
        self.policy = self._build_policy(bundle, cfg, device)
        self.checksum = compute_checksum(bundle["arrays"])
        self.keep_arrays = cfg.dist.cross_policy.pool_size > 0  # the pool keeps replaced weights
        self.arrays = bundle["arrays"] if self.keep_arrays else None
        self.generator = torch.Generator().manual_seed(seed)
        self.train_problems = list(train_problems or [])
        from tether.dist.pool import PolicyPool

        self.pool = PolicyPool(cfg.dist.cross_policy, self.policy, seed + 1)
        self.broker = None  # partial rollouts (tether.dist.partial), created on first use
        self.orders = 0
        self._order_lock = threading.Lock()  # dist.inflight: the actor runs weights beside an order
        self._sync_lock = threading.Lock()  # one weight sync at a time: a newer offer never lands mid-probe
        self.inflight_switches = 0
        if cfg.dist.inflight:
            from tether.policy.inflight import WeightFeed

            self.policy.weight_feed = WeightFeed()

    @staticmethod
    def _build_policy(bundle, cfg, device):
        if cfg.dist.backend == "vllm":
            from tether.policy.vllm import build_vllm_policy  # lazy: the CPU path never imports vllm

            return build_vllm_policy(bundle, cfg.dist.vllm, seed=cfg.run.seed)
        from tether.policy.weights import build_policy_from_bundle

        return build_policy_from_bundle(bundle, device)

    # ------------------------------------------------------------------ weights

    def load_weights(self, version: int, arrays: Mapping[str, Any], checksum: str,
                     probe_ids: Sequence[int] | None = None) -> dict[str, Any]:
        """Load, verify, adopt `version`; returns the ack (ok, version, checksum, probe log-probs).
        Syncs are serialised: in a threaded actor (dist.inflight) the next version's sync could
        otherwise hand its weights to a running decode loop while this one scores its probe."""
        with self._sync_lock:
            return self._load_weights(version, arrays, checksum, probe_ids)

    def _load_weights(self, version: int, arrays: Mapping[str, Any], checksum: str,
                      probe_ids: Sequence[int] | None) -> dict[str, Any]:
        t0 = time.perf_counter()
        old_version, old_arrays = self.policy.version, self.arrays
        try:
            got = self._load_now_or_in_flight(version, arrays)
        except Exception as err:  # a failed load is reported, not fatal: the version stays old
            return {"ok": False, "worker": self.index, "version": old_version, "error": f"{type(err).__name__}: {err}"}
        if got != checksum:
            return {"ok": False, "worker": self.index, "version": old_version, "checksum": got,
                    "error": f"checksum after load {got} != sent {checksum}"}
        if old_arrays is not None:
            self.pool.remember(old_version, old_arrays)
        self.policy.version, self.checksum = int(version), got
        self.arrays = arrays if self.keep_arrays else None
        probe = self.score_probe(probe_ids) if probe_ids else None
        return {"ok": True, "worker": self.index, "version": int(version), "checksum": got, "probe_logprobs": probe,
                "seconds": time.perf_counter() - t0}

    def _load(self, arrays: Mapping[str, Any]) -> str:
        if hasattr(self.policy, "load_weights"):  # the vLLM engine loads in place and reports its checksum
            return self.policy.load_weights(arrays)
        with torch.no_grad():
            _, unexpected = self.policy.model.load_state_dict(from_numpy_state(arrays, self.policy.device), strict=False)
        return self._held_checksum(arrays, unexpected)

    def _held_checksum(self, arrays: Mapping[str, Any], unexpected=()) -> str:
        held = make_publish_state(self.policy.model)  # everything, or a LoRA model's adapters: exactly what arrives
        if unexpected or set(arrays) != set(held):
            raise ValueError(f"the weights sent do not fit this model: {len(arrays)} tensors for {len(held)} expected, "
                             f"unexpected {list(unexpected)[:3]}, missing {sorted(set(held) - set(arrays))[:3]}")
        return compute_checksum(to_numpy_state(held))

    def _load_now_or_in_flight(self, version: int, arrays: Mapping[str, Any]) -> str:
        """Load now; with dist.inflight while an order generates, hand the weights to its decode
        loop (tether.policy.inflight) and return once it switched (or the order ended first)."""
        feed = getattr(self.policy, "weight_feed", None)
        if feed is None:
            return self._load(arrays)
        if self._order_lock.acquire(blocking=False):
            try:
                return self._load(arrays)
            finally:
                self._order_lock.release()
        feed.offer(version, from_numpy_state(arrays, self.policy.device))
        while self.policy.version != version:
            if self._order_lock.acquire(timeout=0.05):
                try:
                    if feed.take() is not None:  # the order ended before its next decode step: load here
                        return self._load(arrays)
                finally:
                    self._order_lock.release()
                break  # the decode loop took it just before the order ended
        self.inflight_switches += 1
        return self._held_checksum(arrays)

    def score_probe(self, ids: Sequence[int]) -> list[float]:
        """Per-token log-probs (T = 1, no filters) of the probe sequence under the rollout engine."""
        if hasattr(self.policy, "score"):
            return list(self.policy.score(ids))
        from tether.policy.hf import compute_logprobs

        with torch.no_grad():
            ids_BT = torch.tensor([list(ids)])
            logp, _ = compute_logprobs(self.policy, ids_BT, torch.ones_like(ids_BT), 1.0)
        return logp[0, 1:].float().tolist()

    # ------------------------------------------------------------------ rollouts

    def run_order(self, order: Order) -> dict[str, Any]:
        """Groups and metrics for `order` (see Order); refuses when its weights are too old."""
        with self._order_lock:  # one order at a time, also in a threaded actor (dist.inflight)
            if self.policy.version < order.min_version:
                raise StaleWorkerError(f"worker {self.index} holds version {self.policy.version}, order for batch "
                                       f"{order.batch_version} needs >= {order.min_version}")
            return self._run_order(order)

    def _run_order(self, order: Order) -> dict[str, Any]:
        t0, v0 = time.perf_counter(), self.policy.version
        self.orders += 1
        acting = self.pool.acting_policy(self.pool.draw_version())
        if order.generator_state is not None:
            self.generator.set_state(order.generator_state)
        if order.cfg.dist.partial.token_budget is not None:
            groups, metrics, extra = self._run_partial(order, acting)
        else:
            groups, metrics, extra = self._run_collect(order, acting)
        if getattr(self.policy, "weight_feed", None) is not None:  # versions adopted mid-generation (dist.inflight)
            metrics["rollout/inflight_switch_count"] = float(self.policy.version - v0)
        return {"groups": groups, "metrics": metrics, "worker": self.index, "version": int(self.policy.version),
                "acting_version": int(acting.version), "seconds": time.perf_counter() - t0, "pid": os.getpid(),
                "generator_state": self.generator.get_state() if order.generator_state is not None else None, **extra}

    def _run_collect(self, order: Order, acting) -> tuple[list, dict[str, float], dict[str, Any]]:
        from tether.data import ProblemStream
        from tether.rollout import WorkerState, collect_groups, make_rollout

        cfg = order.cfg
        if order.stream_state is not None:  # sequential mode: the trainer's own stream, continued here
            stream = ProblemStream(self.train_problems, cfg.run.seed)
            stream.load_state_dict(order.stream_state)
            per_round = cfg.rollout.problems_per_step
        else:
            stream, per_round = FixedStream(order.problems), int(order.meta["per_round"])
        r = cfg.rollout.model_copy(update={"problems_per_step": per_round})
        ws = WorkerState(policy=acting, stream=stream, generator=self.generator)
        groups, metrics = collect_groups(ws, make_rollout(cfg), r, cfg.algo.dynamic_sampling)
        extra = {"stream_state": stream.state_dict() if order.stream_state is not None else None}
        return groups, metrics, extra

    def _run_partial(self, order: Order, acting) -> tuple[list, dict[str, float], dict[str, Any]]:
        from tether.dist.partial import TurnBroker
        from tether.rollout import compute_rollout_stats, make_rollout

        cfg, p = order.cfg, order.cfg.dist.partial
        if self.broker is None:
            self.broker = TurnBroker(p.token_budget, p.max_parks)
        r, rollout = cfg.rollout, make_rollout(cfg)

        def play(problem, generate):
            return rollout.run(self.policy, [problem], r.n, r.sampling, None, generate=generate)

        self.broker.start(order.problems, play)
        out = self.broker.run_round(acting, self.generator, r.batch_size)
        groups = [g for gs, _ in out["results"] for g in gs]
        metrics = merge_metrics([(m, m.get("env/episodes", 1.0)) for _, m in out["results"]])
        metrics.update(compute_rollout_stats(groups))  # what collect_groups adds on the other path
        metrics.update({"time/generate": out["time/generate"], "time/rollout": out["time/rollout"]})
        extra = {"parked": out["parked"], "resumed": out["resumed"], "forced": out["forced"]}
        return groups, metrics, extra

    def ping(self) -> dict[str, Any]:
        return {"worker": self.index, "version": int(self.policy.version), "pid": os.getpid(),
                "parked": self.broker.live if self.broker is not None else 0}


__all__ = ["FixedStream", "Order", "RolloutWorker", "StaleWorkerError", "merge_metrics"]
