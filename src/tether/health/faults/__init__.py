"""Fault injection for `tether faultbench`: plugins that corrupt one seam of the RL loop.

A fault is a class with a name, a family, the root cause it stands for (what a correct diagnosis
names; `UNEXPLAINED` for a fault outside the diagnosis taxonomy), two severities (`subtle`,
`obvious`) and the seam(s) it acts on. The loop calls the seams through one object, `st.faults`,
which is `NO_FAULTS` (every seam returns its input) unless `health.inject` names faults, so the
no-fault path costs one method call per seam:

    st.faults.begin_step()                         # config faults: run-settings changes, first in a step
    problems, sampling = st.faults.begin_rollout(problems, sampling)   # data, sampler, weight sync
    groups = st.faults.end_rollout(groups)         # rewards, rollout log-probs, grouping
    adv = st.faults.on_advantages(adv, group_B)    # credit assignment (AdvantageOutputs)
    batch = st.faults.on_batch(batch)              # loss inputs: loss mask, advantages, rollout log-probs
    ref = st.faults.on_reference(st.ref)           # the reference model (KL) the update uses
  and inside the update (tether.train.update.run_update):
    old = faults.on_old_logp(old_BT, batch)        # pi_old (scored, also in fused mode, when a fault wants it)
    norm = faults.on_norm(norm, mini)              # the mini-batch's loss normaliser (AggNorm)
    terms = faults.on_loss(terms, mb)              # a micro-batch's aggregated loss terms (pg, entropy, kl, value)
    faults.before_optimizer_step(opt, sched, params)   # gradients, optimizer and scheduler state

The health checks read the batch after every fault seam (the advantage checks included), so a
fault is measured where it acts. Module forward hooks (`install`) run on every path: the fast
training and decoding paths (tether.policy.lean_train, tether.policy.decode) step aside for a
model that carries them.

`begin_rollout` may swap the engine the rollout runs on (`st.policy`; the sampling settings it
returns); `end_rollout` swaps the policy back, so the trainer never sees the swap. A fault
overrides the hooks of its seam (the step being computed is passed as `step`, 1-based):

    begin_step(st, cfg, step)              config faults (a bad LR, temperature, reward weight): `cfg`
                                           is the config in force (frozen); a fault changes it with
                                           `self.set(st, "algo.epochs", 8)`, a run-settings change
                                           (tether.settings) that is checkpointed and logged
    on_problems(problems, step)            data: what the loader hands out
    on_sampler(policy, sampling, step)     sampler / weight sync: what the rollout engine runs
    on_rollouts(groups, step)              rewards, rollout log-probs, grouping
    on_advantages(adv_BT, group_B, step)   credit assignment
    on_batch(batch, step)                  the loss's inputs (TrainBatch: loss_mask_BT, advantages_BT,
                                           rollout_logp_BT, ...): loss-mask and loss-term bugs
    on_reference(ref, policy, step)        the reference policy of the KL term (ref may be None)
    on_old_logp(old_BT, batch, step)       pi_old's log-probs [B, T] of the whole batch
    on_norm(norm, mini, step)              the mini-batch's AggNorm (tether.algos.aggregate)
    on_loss(terms, mb, step)               dict of the micro-batch's aggregated terms: pg, entropy, kl, value
    before_optimizer_step(opt, sched, params, step)   after the backward, before each optimizer step
    install(st, cfg, step_fn)              torch hooks (grad, optimizer step, module forward hooks)

Every fault also gets `self.view` (a `FaultView`): read-only views of the policy (`view.policy`:
attributes readable, none assignable) and of the training problems (`view.dataset`: a tuple of
read-only mappings), for faults that need to look at the model or the data to corrupt a seam.

What `tether faultbench` reads from the class: `name` (or the `package.module:Class` /
`path/to/file.py:Class` spec), `family`, `cause` (scored against the diagnosis), `severities`
(one or two of subtle/obvious; a one-severity fault runs only at that one), `remediable`, and
optionally `base` (config overrides of the faulty runs, e.g. `("algo.epochs=2",)`) and
`start_step` (the step the fault starts at instead of the benchmark's; 1 = present from the start).

Add a fault type in one file: drop a module into this package (it is imported on first use) or
anywhere importable and name it as `package.module:ClassName` in `health.inject`::

    @register_fault
    class MyFault(Fault):
        name, family, cause = "my_fault", "data", "data_corruption"
        severities = {"subtle": {"p": 0.2}, "obvious": {"p": 0.8}}
        def on_problems(self, problems, step):
            return [dict(p, answer="?") if self.coin(step, p["id"]) < self.p["p"] else p for p in problems]
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import os
import pkgutil
import random
import sys
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, ClassVar, Sequence

FAMILIES = ("reward", "optimisation", "credit_assignment", "data", "system")
FAULTS: dict[str, type["Fault"]] = {}
UNEXPLAINED = "unexplained"  # the `cause` of a fault outside the taxonomy (tether.health.diagnosis.UNEXPLAINED)


def register_fault(cls: type["Fault"]) -> type["Fault"]:
    """Class decorator: make a fault available by its `name`."""
    if not cls.name or cls.family not in FAMILIES:
        raise ValueError(f"fault {cls.__name__}: needs a name and a family in {FAMILIES}")
    if cls.name in FAULTS and FAULTS[cls.name] is not cls:
        raise ValueError(f"fault {cls.name!r} is registered twice")
    FAULTS[cls.name] = cls
    return cls


class Fault:
    """One injected fault. Subclasses override the seams they corrupt; the others pass through."""

    name: ClassVar[str] = ""
    family: ClassVar[str] = ""
    cause: ClassVar[str] = ""  # the diagnosis a correct doctor names (tether.health.diagnosis.CAUSES)
    seam: ClassVar[str] = ""
    remediable: ClassVar[bool] = False  # can an action of the catalogue repair it (decided a priori)
    severities: ClassVar[dict[str, dict[str, Any]]] = {"subtle": {}, "obvious": {}}
    description: ClassVar[str] = ""
    base: ClassVar[tuple[str, ...]] = ()  # faultbench: config overrides of the runs this fault is injected into
    start_step: ClassVar[int | None] = None  # faultbench: first faulty step (None: the benchmark's --start)
    view: "FaultView | None" = None

    def __init__(self, severity: str = "obvious", start: int = 1, params: dict[str, Any] | None = None, seed: int = 0) -> None:
        if severity not in self.severities:
            raise ValueError(f"fault {self.name}: severity must be one of {sorted(self.severities)}, got {severity!r}")
        self.severity, self.start, self.seed = severity, int(start), int(seed)
        self.p: dict[str, Any] = {**self.severities[severity], **(params or {})}

    def active(self, step: int) -> bool:
        return step >= self.start

    def set(self, st: Any, path: str, value: Any) -> None:
        """Put a config value in force from this step on (`st.settings`, tether.settings)."""
        st.settings.set(path, value, source=f"fault {self.name}", step=int(st.step) + 1)

    def wrap_first_reward(self, st: Any, cfg: Any, wrapper: str, **kwargs: Any) -> bool:
        """Put the reward `wrapper` (`package.module:function`, called with `inner=` the wrapped
        component's name and `kwargs`) around the first reward component, from this step on; the
        correctness component follows when it was the first. False when it is wrapped already."""
        comps = list(cfg.reward.components)
        first = comps[0]
        if first.name == wrapper:
            return False
        comps[0] = first.model_copy(update={"name": wrapper, "kwargs": {"inner": first.name, **kwargs}})
        self.set(st, "reward.components", comps)
        if cfg.reward.correctness in (None, first.name):
            self.set(st, "reward.correctness", wrapper)
        return True

    def coin(self, *key: Any) -> float:
        """A reproducible uniform number in [0, 1) for `key` (never touches the run's RNGs)."""
        h = hashlib.blake2b(repr((self.name, self.seed) + key).encode(), digest_size=8).digest()
        return int.from_bytes(h, "big") / 2.0**64

    def rng(self, step: int) -> random.Random:
        return random.Random(int(self.coin("rng", step) * 2**62))

    # ---- seams (identity by default)
    def begin_step(self, st: Any, cfg: Any, step: int) -> None:
        pass

    def on_problems(self, problems: list[dict[str, Any]], step: int) -> list[dict[str, Any]]:
        return problems

    def on_sampler(self, policy: Any, sampling: Any, step: int) -> tuple[Any, Any]:
        return policy, sampling

    def on_rollouts(self, groups: list[Any], step: int) -> list[Any]:
        return groups

    def on_advantages(self, adv_BT: Any, group_B: Any, step: int) -> Any:
        return adv_BT

    def on_batch(self, batch: Any, step: int) -> Any:
        return batch

    def on_reference(self, ref: Any, policy: Any, step: int) -> Any:
        return ref

    def on_old_logp(self, old_BT: Any, batch: Any, step: int) -> Any:
        return old_BT

    def on_norm(self, norm: Any, mini: Any, step: int) -> Any:
        return norm

    def on_loss(self, terms: dict[str, Any], mb: Any, step: int) -> dict[str, Any]:
        return terms

    def before_optimizer_step(self, optimizer: Any, scheduler: Any, params: list, step: int) -> None:
        pass

    def install(self, st: Any, cfg: Any, step_fn: Callable[[], int]) -> None:
        pass

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "family": self.family, "cause": self.cause, "severity": self.severity,
                "start": self.start, "params": dict(self.p), "remediable": self.remediable}


class ReadOnly:
    """A view of an object whose attributes can be read (and methods called) but not assigned."""

    __slots__ = ("_obj",)

    def __init__(self, obj: Any) -> None:
        object.__setattr__(self, "_obj", obj)

    def __getattr__(self, name: str) -> Any:
        return getattr(object.__getattribute__(self, "_obj"), name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"read-only view: cannot set {name!r}")


class FaultView:
    """What a fault may look at: the trainer's policy and the training problems, read-only."""

    def __init__(self, st: Any) -> None:
        self._st = st

    @property
    def policy(self) -> Any:
        return ReadOnly(self._st.policy)

    @property
    def dataset(self) -> tuple:
        stream = getattr(self._st, "stream", None)
        return tuple(MappingProxyType(p) for p in getattr(stream, "problems", ()))


class NoFaults:
    """The null object behind `st.faults` when nothing is injected: every seam is the identity."""

    faults: tuple = ()

    def __bool__(self) -> bool:
        return False

    def begin_step(self) -> None:
        pass

    def begin_rollout(self, problems, sampling):
        return problems, sampling

    def end_rollout(self, groups):
        return groups

    def on_advantages(self, adv, group_B):
        return adv

    def on_batch(self, batch):
        return batch

    def on_reference(self, ref):
        return ref

    def wants(self, seam: str) -> bool:
        return False

    def on_old_logp(self, old_BT, batch):
        return old_BT

    def on_norm(self, norm, mini):
        return norm

    def on_loss(self, terms, mb):
        return terms

    def before_optimizer_step(self, optimizer, scheduler, params):
        pass


NO_FAULTS = NoFaults()


class FaultSet:
    """The injected faults of a run, called at the seams; the current step comes from `st.step`, the
    config in force from `st.settings` (tether.settings)."""

    def __init__(self, faults: Sequence[Fault], st: Any) -> None:
        self.faults = tuple(faults)
        self.st = st
        self._begun = 0
        self._swapped: Any = None
        for f in self.faults:
            f.view = FaultView(st)
            f.install(st, st.settings.config, self._step)

    def __bool__(self) -> bool:
        return bool(self.faults)

    def _step(self) -> int:
        return int(self.st.step) + 1

    def begin_step(self) -> None:
        """Apply the config faults of the step about to be computed (once per step; the recipe
        calls this first in a step, so the whole step runs under the settings they put in force)."""
        step = self._step()
        if self._begun != step:
            self._begun = step
            for f in self.faults:
                if f.active(step):
                    f.begin_step(self.st, self.st.settings.config, step)

    def _live(self) -> list[Fault]:
        self.begin_step()
        step = self._step()
        return [f for f in self.faults if f.active(step)]

    def begin_rollout(self, problems, sampling):
        """(problems, sampling) for this step's rollout; a sampler fault may swap `st.policy` too."""
        live, step = self._live(), self._step()
        for f in live:
            problems = f.on_problems(problems, step)
        policy = self.st.policy
        for f in live:
            policy, sampling = f.on_sampler(policy, sampling, step)
        if policy is not self.st.policy:
            self._swapped, self.st.policy = self.st.policy, policy
        return problems, sampling

    def end_rollout(self, groups):
        if self._swapped is not None:
            self.st.policy, self._swapped = self._swapped, None
        for f in self._live():
            groups = f.on_rollouts(groups, self._step())
        return groups

    def on_advantages(self, adv, group_B):
        adv_BT = adv.advantages_BT
        for f in self._live():
            adv_BT = f.on_advantages(adv_BT, group_B, self._step())
        return adv if adv_BT is adv.advantages_BT else dataclasses.replace(adv, advantages_BT=adv_BT)

    def on_batch(self, batch):
        for f in self._live():
            batch = f.on_batch(batch, self._step())
        return batch

    def on_reference(self, ref):
        for f in self._live():
            ref = f.on_reference(ref, self.st.policy, self._step())
        return ref

    def wants(self, seam: str) -> bool:
        """Whether an injected fault overrides the seam `seam` (the update scores pi_old for `on_old_logp`)."""
        return any(getattr(type(f), seam) is not getattr(Fault, seam) for f in self.faults)

    def on_old_logp(self, old_BT, batch):
        for f in self._live():
            old_BT = f.on_old_logp(old_BT, batch, self._step())
        return old_BT

    def on_norm(self, norm, mini):
        for f in self._live():
            norm = f.on_norm(norm, mini, self._step())
        return norm

    def on_loss(self, terms, mb):
        for f in self._live():
            terms = f.on_loss(terms, mb, self._step())
        return terms

    def before_optimizer_step(self, optimizer, scheduler, params):
        for f in self._live():
            f.before_optimizer_step(optimizer, scheduler, params, self._step())


_LOADED = False


def load_fault_plugins() -> dict[str, type[Fault]]:
    """Import every module of this package once (each registers its faults); returns FAULTS."""
    global _LOADED
    if not _LOADED:
        for info in pkgutil.iter_modules(__path__):
            importlib.import_module(f"{__name__}.{info.name}")
        _LOADED = True
    return FAULTS


def get_fault_class(name: str) -> type[Fault]:
    """A registered fault by name, or `package.module:ClassName` from user code."""
    if ":" in name:
        module, _, attr = name.rpartition(":")
        cls = getattr(_import_user_module(module), attr, None)
        if not (isinstance(cls, type) and issubclass(cls, Fault)):
            raise ValueError(f"fault {name!r}: {attr!r} in {module!r} is not a Fault subclass")
        return cls
    faults = load_fault_plugins()
    if name not in faults:
        raise ValueError(f"unknown fault {name!r}; valid: {', '.join(sorted(faults))}")
    return faults[name]


def _import_user_module(module: str) -> Any:
    """`package.module` (importable, or importable from the working directory) or a `.py` path."""
    if module.endswith(".py"):
        path = Path(module).resolve()
        if not path.is_file():
            raise ValueError(f"fault module {module!r}: no such file")
        name = "tether_user_fault_" + hashlib.blake2b(str(path).encode(), digest_size=6).hexdigest()
        if name not in sys.modules:
            spec = importlib.util.spec_from_file_location(name, path)
            mod = importlib.util.module_from_spec(spec)
            sys.modules[name] = mod
            spec.loader.exec_module(mod)
        return sys.modules[name]
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name != module.split(".")[0] or os.getcwd() in sys.path:
            raise ValueError(f"fault module {module!r}: {err}") from None
        sys.path.insert(0, os.getcwd())  # `python -m` would have; the `tether` script does not
        try:
            return importlib.import_module(module)
        except ModuleNotFoundError as err2:
            raise ValueError(f"fault module {module!r}: {err2}") from None


def build_faults(specs: Sequence[Any], st: Any, seed: int = 0) -> FaultSet | NoFaults:
    """`st.faults` for a run: NO_FAULTS when `specs` is empty, else a FaultSet with hooks installed."""
    if not specs:
        return NO_FAULTS
    faults = []
    for s in specs:
        d = s.model_dump() if hasattr(s, "model_dump") else dict(s)
        cls = get_fault_class(d["name"])
        faults.append(cls(d.get("severity", "obvious"), d.get("start", 1), d.get("params") or {}, seed))
    return FaultSet(faults, st)


__all__ = ["FAMILIES", "FAULTS", "UNEXPLAINED", "Fault", "FaultSet", "FaultView", "ReadOnly", "NO_FAULTS", "NoFaults", "build_faults", "get_fault_class",
           "load_fault_plugins", "register_fault"]
