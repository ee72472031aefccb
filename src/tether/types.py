"""Typed, immutable values that flow through one RL step.

tasks -> rollout -> rewards -> groups -> advantages -> batch -> update -> telemetry -> health

Token ids are the only truth: a `Turn` stores the ids that were sampled (`action_ids`) and the ids
that the environment appended (`observation_ids`); text is derived for display and rewards, never
re-tokenised for training. Masks are built from lengths and stop reasons (see `train/batching.py`),
never from token values, so `pad == eos` and several eos ids are safe.

Shape suffixes (docs/design.md, house rule 4): `_B` sequences, `_T` tokens, `_G` group members.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch


class StopReason(str, enum.Enum):
    """Why a sample or an episode ended.

    `EOS` and `DONE` are natural ends; the others are truncations that compact filtering
    (`algos/corrections.py`) may mask, keep as negatives or zero, per reason.
    """

    EOS = "eos"  # the model emitted an end-of-sequence / stop token
    LENGTH = "length"  # max_new_tokens reached (truncated response)
    DONE = "done"  # the environment said the episode is over
    MAX_TURNS = "max_turns"
    CONTEXT_OVERFLOW = "context_overflow"
    TIMEOUT = "timeout"
    ENV_ERROR = "env_error"
    PARSE_ERROR = "parse_error"

    @property
    def truncated(self) -> bool:
        return self not in (StopReason.EOS, StopReason.DONE)


class Outcome(str, enum.Enum):
    """Tagged result of a reward function or environment call (failures are values)."""

    OK = "ok"
    ERROR = "error"
    TIMEOUT = "timeout"
    INVALID = "invalid"


@dataclass(frozen=True)
class Message:
    """One chat message. `action_ids` are the ids an assistant sampled: when set, they are
    spliced into contexts verbatim and `content` (their decoded text) is for display only.
    (Here, not in `tether.policy.chat`, so that environments never import the policy package.)"""

    role: str
    content: str
    action_ids: tuple[int, ...] | None = None

    def to_dict(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


@dataclass(frozen=True)
class Sample:
    """One generation from a `Policy`.

    `logprobs` are per-token log-probabilities *of the distribution that was sampled from*
    (logits / temperature), one per entry of `token_ids`. `token_ids` include the stop token when
    the model emitted one (`finish == EOS`), so the model learns to stop.
    """

    prompt_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish: StopReason
    policy_version: int = 0
    # the sampling mask (DeepSeek-V3.2 "Keep Sampling Mask"): per token, how many vocabulary
    # entries top-k / top-p / min-p kept (the highest-logit ones); () when no filter was on
    kept: tuple[int, ...] = ()
    # in-flight weight updates (tether.policy.inflight): the policy version of every token; ()
    # when the whole sample came from `policy_version`
    token_versions: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        if n != len(self.logprobs) or (self.kept and len(self.kept) != n) or (self.token_versions and len(self.token_versions) != n):
            raise ValueError(f"Sample: {n} token ids but {len(self.logprobs)} logprobs / {len(self.kept)} kept counts / "
                             f"{len(self.token_versions)} token versions")


@dataclass(frozen=True)
class Turn:
    """One transition z_t = (o_t, a_t, e_t, r_t, o_{t+1}) of a (possibly single-turn) episode.

    `context_ids` is exactly what the model saw when it acted (o_t rendered by the context
    builder); `action_ids`/`action_logprobs` are what it sampled (a_t); `observation_ids` are the
    tokens the environment appended afterwards (part of o_{t+1}; never trained on).
    """

    context_ids: tuple[int, ...]
    action_ids: tuple[int, ...]
    action_logprobs: tuple[float, ...]
    observation_ids: tuple[int, ...] = ()
    reward: float = 0.0
    finish: StopReason = StopReason.EOS
    policy_version: int = 0
    info: Mapping[str, Any] = field(default_factory=dict)
    action_kept: tuple[int, ...] = ()  # the sampler's kept counts per action token (Sample.kept); () unfiltered
    action_versions: tuple[int, ...] = ()  # per action token (Sample.token_versions, in-flight updates); () all policy_version

    def __post_init__(self) -> None:
        n = len(self.action_ids)
        if n != len(self.action_logprobs) or (self.action_kept and len(self.action_kept) != n) or (
                self.action_versions and len(self.action_versions) != n):
            raise ValueError(f"Turn: {n} action ids but {len(self.action_logprobs)} logprobs / {len(self.action_kept)} "
                             f"kept counts / {len(self.action_versions)} versions")


@dataclass(frozen=True)
class RewardResult:
    """The scored outcome of one trajectory: a total plus its named components."""

    total: float
    components: Mapping[str, float] = field(default_factory=dict)
    outcome: Outcome = Outcome.OK
    correct: bool | None = None  # verified correctness, tracked apart from the reward
    error: str = ""


@dataclass(frozen=True)
class Trajectory:
    """An episode: its turns, the final reward and why it stopped."""

    task_id: str
    turns: tuple[Turn, ...]
    reward: RewardResult
    stop: StopReason
    info: Mapping[str, Any] = field(default_factory=dict)

    @property
    def response_ids(self) -> tuple[int, ...]:
        return tuple(t for turn in self.turns for t in turn.action_ids)

    @property
    def num_action_tokens(self) -> int:
        return sum(len(t.action_ids) for t in self.turns)


@dataclass(frozen=True)
class TrajectoryGroup:
    """The n rollouts of one task; group-relative advantages are computed within it."""

    task_id: str
    trajectories: tuple[Trajectory, ...]
    task: Mapping[str, Any] = field(default_factory=dict)

    @property
    def rewards_G(self) -> list[float]:
        return [t.reward.total for t in self.trajectories]


@dataclass(frozen=True)
class TrainBatch:
    """Padded tensors for the update, built by `batching.build_train_batch`.

    All `_BT` tensors share shape [B, T] (right-padded). `loss_mask_BT` is 1 exactly on sampled
    action tokens of kept sequences; `input_ids_BT[:, t]` is predicted from positions `< t`, so
    `logp_BT[:, t]` is the log-probability of token t given its prefix (position 0 is never in
    the loss).
    """

    input_ids_BT: torch.Tensor  # long
    attention_mask_BT: torch.Tensor  # bool: real (non-pad) tokens
    loss_mask_BT: torch.Tensor  # float {0,1}: tokens that get gradient
    rollout_logp_BT: torch.Tensor  # float: log-probs recorded at sampling (0 off-mask)
    advantages_BT: torch.Tensor  # float
    seq_group_B: torch.Tensor  # long: index of the TrajectoryGroup each sequence belongs to
    seq_traj_B: torch.Tensor  # long: index of the trajectory (sequences of one episode share it)
    returns_BT: torch.Tensor | None = None  # GAE value targets
    old_values_BT: torch.Tensor | None = None
    kept_BT: torch.Tensor | None = None  # long: the sampler's kept count for token t (0: full vocabulary)

    @property
    def num_seqs(self) -> int:
        return int(self.input_ids_BT.shape[0])

    @property
    def num_loss_tokens(self) -> int:
        return int(self.loss_mask_BT.sum().item())

    def select(self, idx_B: torch.Tensor) -> "TrainBatch":
        """Rows `idx_B` of every tensor (used for micro-batching)."""

        def pick(x: torch.Tensor | None) -> torch.Tensor | None:
            return None if x is None else x[idx_B]

        return TrainBatch(
            input_ids_BT=self.input_ids_BT[idx_B],
            attention_mask_BT=self.attention_mask_BT[idx_B],
            loss_mask_BT=self.loss_mask_BT[idx_B],
            rollout_logp_BT=self.rollout_logp_BT[idx_B],
            advantages_BT=self.advantages_BT[idx_B],
            seq_group_B=self.seq_group_B[idx_B],
            seq_traj_B=self.seq_traj_B[idx_B],
            returns_BT=pick(self.returns_BT),
            old_values_BT=pick(self.old_values_BT),
            kept_BT=pick(self.kept_BT),
        )
