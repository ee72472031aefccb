"""Diagnosis: ranked root-cause hypotheses from the findings of recent steps.

Each cause has a fingerprint: weights on the detectors (or `detector:rule` sub-rules) whose
findings it explains (a negative weight is evidence against it). A hypothesis scores sum(weight x severity x earliness) over the distinct
signatures present, where the earliest-firing signatures count 1.5x (a root cause shows first;
its consequences - a falling accuracy, a grad spike - follow; one step later counts 1.2x). Ranked by score; `confidence` is the
score's share of all scores. The fingerprints encode how each failure shows in telemetry
(docs/health/README.md; docs/design.md, correctness rules 3-8, 12, 16 and 17); faultbench measures how often the top
hypothesis is the injected cause. When no fingerprint explains the findings, or the two best
explain them about equally (top confidence < 0.3 and a second within 80% of its score), the first
hypothesis is `unknown` with the evidence: auto mode then never acts on a guess (it halts once
accuracy regresses).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from tether.health.detectors import Finding, RunContext


@dataclass(frozen=True)
class Cause:
    name: str
    family: str  # reward | optimisation | credit_assignment | data | system
    title: str
    fingerprint: dict[str, float]
    actions: tuple[str, ...] = ()  # remediation candidates, in order (tether.health.remediation)
    advice: str = ""


CAUSES: dict[str, Cause] = {c.name: c for c in (
    Cause("lr_too_high", "optimisation", "update size too large (learning rate, clipping off, too many epochs)",
          {"grad_spike": 3, "kl_explosion": 4, "kl_explosion:sustained": -2, "update_size": 4, "clip_saturation": 2, "entropy_explosion": 1,
           "nonfinite": 1, "regression": 0.5, "accuracy_drop": 0.5, "length": 0.3},
          ("restore_clip", "lower_epochs", "lower_lr", "lower_lr_x10", "raise_kl"),
          "lower train.lr (or raise warm-up), keep PPO clipping on, fewer epochs per batch, add a KL anchor"),
    Cause("numerical_instability", "optimisation", "non-finite loss or gradient",
          {"nonfinite": 4, "grad_spike": 0.5}, ("lower_lr",),
          "check log-ratio clamps, masked positions before exp, the reward for NaN; lower the LR"),
    Cause("entropy_collapse", "optimisation", "exploration collapsed (temperature too low, entropy penalty)",
          {"entropy_collapse": 3, "no_signal": 0.5, "length:collapse": 0.3},
          ("raise_temperature",), "raise rollout temperature, clip-higher, Clip-Cov/KL-Cov, an entropy bonus"),
    Cause("entropy_explosion", "optimisation", "entropy blow-up (entropy bonus / clip-higher too permissive)",
          {"entropy_explosion": 3, "length:blowup": 0.3, "regression": 0.3, "kl_explosion": -1.5,
           "kl_explosion:sustained": 1.5, "grad_spike": -1},
          ("drop_entropy_bonus", "raise_kl", "lower_lr"), "lower algo.entropy_coef or clip_high; add a KL anchor"),
    Cause("exploitable_reward", "reward", "the reward pays for something other than correctness (reward hacking)",
          {"reward_hacking": 3, "reward_hacking:component": 2, "reward_noise:auc": 1, "length": 1, "entropy_collapse": 0.3,
           "proxy_reward": -2},
          ("downweight_component", "raise_kl"), "fix the loophole in the verifier / shaping term; down-weight it"),
    Cause("learned_reward_exploited", "reward", "a learned reward (reward model, judge) is being exploited: "
          "it no longer agrees with the verifier on held-out probes",
          {"learned_reward": 5, "learned_reward:agreement": 3, "reward_hacking": 0.5, "proxy_reward": 8},
          ("downweight_component", "halt"),
          "stop RL against it (DeepSeek-R1 caps RM-based RL), retrain the RM on the policy's recent samples, "
          "or mix in a verifiable reward; down-weight the component"),
    Cause("noisy_reward", "reward", "noisy or mis-scaled reward (correct answers not reliably paid)",
          {"reward_noise": 1.5, "reward_noise:correct_unpaid": 4, "reward_hacking": 1, "regression": 0.5,
           "reward_linkage": -5, "proxy_reward": -3},
          (), "check the verifier / judge on labelled samples; increase n or use a stricter verifier"),
    Cause("misaligned_reward", "reward", "the reward scores the wrong thing (inverted, or attached to the wrong samples)",
          {"reward_linkage": 2, "reward_linkage:linkage": 6, "reward_linkage:inverted": 6, "reward_noise": 0.5,
           "regression": 0.3, "accuracy_drop": 0.3}, ("halt",),
          "check the reward's sign and that each reward record is indexed by the sample it scores"),
    Cause("reward_failures", "reward", "reward function failing (errors, time-outs, invalid values)",
          {"error_surge": 4, "stall": 0.5}, (),
          "see reward/error_rate and samples' error fields; fix the reward service"),
    Cause("advantage_bug", "credit_assignment", "advantage sign / estimator bug",
          {"advantage_misalignment": 4, "advantage_invariants": 4, "regression": 0.5, "accuracy_drop": 0.3}, ("halt",),
          "check the advantage estimator: advantages must rise with reward inside a group"),
    Cause("grouping_bug", "credit_assignment", "samples grouped with the wrong prompt",
          {"group_integrity": 5, "group_structure:size": 6, "advantage_invariants": 0.5}, ("halt",),
          "samples of one prompt must share one group id (uid), and a group holds rollout.n samples"),
    Cause("loss_mask_bug", "credit_assignment", "the loss mask does not cover exactly the sampled tokens",
          {"loss_mask": 5, "length": 0.5, "truncation": 0.5}, ("halt",),
          "build the mask from lengths and stop reasons (never token values: pad may equal eos)"),
    Cause("data_corruption", "data", "corrupted data (wrong labels, damaged prompts)",
          # a regression that no optimisation, reward or credit signal explains points at the data
          {"data_shift:prompt": 3, "data_shift:unsolvable": 3, "regression": 1.5, "accuracy_drop": 1, "no_signal": 0.3},
          ("halt",),
          "inspect samples/step_*.jsonl.gz: prompts and gold answers"),
    Cause("data_repetition", "data", "the data loader repeats the same problems",
          {"data_shift:repeat": 4}, ("halt",), "check the loader's epoch/shuffle state"),
    Cause("duplicate_problems", "data", "the loader hands out the same problem several times in one step",
          {"group_structure:duplicate": 5, "data_shift:repeat": 0.5}, ("halt",),
          "check the sampler / sharding: each rank must read a distinct shard of every batch"),
    Cause("stale_weights", "system", "rollout engine runs stale weights (weight sync not delivered)",
          {"stale_weights": 5, "stale_weights:checksum": 3, "logp_gap": 1, "logp_gap:sawtooth": 4, "logp_floor": 0.5},
          ("halt",),
          "verify the weight-sync handshake (version + checksum) and probe log-probs after each sync"),
    Cause("rollout_mismatch", "system", "rollout sampling settings or numerics differ from the trainer's",
          {"logp_gap": 3, "logp_floor": 3, "logp_gap:sawtooth": -2, "stale_weights": -3, "entropy_collapse": 0.3},
          ("enable_is_correction",),
          "align temperature/top-p/top-k and precision between engine and trainer; keep TIS/MIS on"),
    Cause("slow_component", "system", "a slow reward, environment or sync stalls the steps",
          {"stall": 4}, (), "see time/* per phase; scale the reward service or raise its concurrency"),
    Cause("truncation", "system", "generation limit too short: responses truncated",
          {"truncation": 3, "no_signal": 1.5, "length": 0.3}, ("raise_max_tokens", "raise_max_tokens_x4"),
          "raise rollout.sampling.max_new_tokens (or add overlong shaping)"),
    Cause("no_signal", "data", "no learning signal (tasks all solved or all failed)",
          {"no_signal": 2}, (), "adjust task difficulty, raise rollout.n, enable dynamic sampling"),
)}


@dataclass(frozen=True)
class Hypothesis:
    cause: str
    family: str
    title: str
    score: float
    confidence: float
    since: int
    evidence: list[dict[str, Any]] = field(default_factory=list)
    actions: tuple[str, ...] = ()
    advice: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"cause": self.cause, "family": self.family, "title": self.title, "score": round(self.score, 3),
                "confidence": round(self.confidence, 3), "since": self.since, "evidence": self.evidence,
                "actions": list(self.actions), "advice": self.advice}


REWARD_SIGNALS = ("reward_noise", "reward_hacking", "reward_linkage", "learned_reward")


def proxy_reward(ctx: RunContext | None) -> bool:
    """The training reward is not the verifier: the correctness component is unpaid (weight 0)
    while another component is paid - a reward model, a judge, a rubric standing in for it."""
    if ctx is None or not ctx.correctness:
        return False
    w = ctx.reward_weights
    return w.get(ctx.correctness, 1.0) == 0.0 and any(v != 0.0 for k, v in w.items() if k != ctx.correctness)


def signatures(f: Finding, proxy: bool = False) -> list[str]:
    """The fingerprint keys a finding matches: its detector, plus `detector:rule`/direction, plus
    `proxy_reward` for a reward-vs-verdict finding when the paid reward is a proxy of the verifier
    (then a correct sample left unpaid or a wrong one paid is the proxy disagreeing with the
    verifier - what `learned_reward_exploited` names - not noise in a verifier)."""
    keys = [f.detector]
    for k in ("rule", "direction"):
        v = f.evidence.get(k)
        if v is None:
            v = next((e.get(k) for e in f.evidence.values() if isinstance(e, dict) and e.get(k)), None)
        if v:
            keys.append(f"{f.detector}:{v}")
    if proxy and f.detector in REWARD_SIGNALS:
        keys.append("proxy_reward")
    return keys


def diagnose(findings: Iterable[Finding], ctx: RunContext | None = None) -> list[Hypothesis]:
    """Ranked hypotheses (best first) explaining `findings` (the recent ones of a run); `ctx`:
    the run's reward context (a proxy reward makes reward findings point at it)."""
    latest: dict[str, Finding] = {}
    first_since: dict[str, int] = {}
    proxy = proxy_reward(ctx)
    for f in findings:
        for key in signatures(f, proxy):
            prev = latest.get(key)
            if prev is None or f.severity == "critical" or prev.severity != "critical":
                latest[key] = f
            first_since[key] = min(first_since.get(key, f.since), f.since)
    if not latest:
        return []
    earliest = min(first_since.values())
    scored = []
    for cause in CAUSES.values():
        score, ev, since = 0.0, {}, None
        for key, w in cause.fingerprint.items():
            f = latest.get(key)
            if f is None:
                continue
            sev = 1.0 if f.severity == "critical" else 0.6
            lag = first_since[key] - earliest
            score += w * sev * (1.5 if lag == 0 else 1.2 if lag == 1 else 1.0)
            if w > 0:
                since = first_since[key] if since is None else min(since, first_since[key])
                ev.setdefault(f.detector, {"detector": f.detector, "since": first_since[key], "severity": f.severity,
                                           "message": f.message})
        if score > 0 and ev:
            scored.append((score, cause, since, list(ev.values())))
    total = sum(s for s, *_ in scored)
    scored.sort(key=lambda x: (-x[0], x[2]))
    hyps = [Hypothesis(c.name, c.family, c.title, s, s / total, since, ev, c.actions, c.advice) for s, c, since, ev in scored]
    if not hyps or (len(hyps) > 1 and hyps[0].confidence < UNKNOWN_CONFIDENCE and hyps[1].score > 0.8 * hyps[0].score):
        return [unknown_hypothesis(latest, first_since, earliest)] + hyps
    return hyps


UNKNOWN_CONFIDENCE = 0.3  # below this, with a close second, no cause is named


def unknown_hypothesis(latest: dict[str, Finding], first_since: dict[str, int], earliest: int) -> Hypothesis:
    """"Unknown - here is the evidence": no fingerprint explains the findings, or two explain them
    about equally; a confident wrong label would send the user (and auto mode) the wrong way."""
    ev = {}
    for key, f in latest.items():
        ev.setdefault(f.detector, {"detector": f.detector, "since": first_since[key], "severity": f.severity,
                                   "message": f.message})
    return Hypothesis("unknown", "unknown", "unknown cause: no fingerprint explains the findings clearly", 0.0, 0.0,
                      earliest, list(ev.values()), ("halt",),
                      "inspect the evidence below and samples/step_*.jsonl.gz; `tether doctor` shows every finding")
