"""Pairwise preference losses, registered in PREFERENCE_LOSSES with one signature:

    PREFERENCE_LOSSES[name](PreferenceInputs, DPOConfig) -> (loss_P, metrics)

P is the number of (chosen, rejected) pairs. The inputs are sequence log-probabilities: the sum of
log pi(y_t | x, y_<t) over the response's loss-masked tokens (for a multi-turn pair, over the
assistant tokens only, masked as in RL). The caller averages loss_P over pairs.

- sigmoid (DPO, Rafailov et al. arXiv 2305.18290 Eq. 7):
      h = (log pi(y_w) - log ref(y_w)) - (log pi(y_l) - log ref(y_l)),   loss = -log sigma(beta h)
- ipo (Azar et al. arXiv 2310.12036 Eq. 17): loss = (h - 1/(2 beta))^2, on the same h (summed
  log-probs, as the paper writes it; TRL's `ipo` averages the log-probs over tokens instead);
- simpo (Meng et al. arXiv 2405.14734 Eq. 6), the reference-free variant:
      loss = -log sigma(beta/|y_w| log pi(y_w) - beta/|y_l| log pi(y_l) - gamma).
  Chosen over ORPO because it is a pairwise loss on exactly the inputs DPO already computes
  (minus the reference), so it shares this signature and the stage's data path; ORPO adds an NLL
  term and an odds ratio, i.e. a second objective with its own weight. SimPO also needs no
  reference forward, which halves the scoring cost of a step.

Metrics (detached, averaged over pairs): reward_margin (the argument of the link, before beta
for DPO/IPO: h), accuracy (fraction of pairs with a positive margin), chosen_reward and
rejected_reward (beta times each side's log-ratio; SimPO: beta times the length-normalised logp).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from tether.algos.base import Metrics
from tether.registry import Registry

PREFERENCE_LOSSES: Registry[Callable] = Registry("preference loss")


@dataclass(frozen=True)
class PreferenceInputs:
    """Sequence log-probs [P] of the chosen (w) and rejected (l) responses under the policy (with
    gradient) and the reference (constants; None for reference-free losses); lengths in tokens."""

    chosen_logp_P: torch.Tensor
    rejected_logp_P: torch.Tensor
    ref_chosen_logp_P: torch.Tensor | None = None
    ref_rejected_logp_P: torch.Tensor | None = None
    chosen_len_P: torch.Tensor | None = None
    rejected_len_P: torch.Tensor | None = None


def compute_sequence_logps(logp_BT: torch.Tensor, mask_BT: torch.Tensor, owner_B: torch.Tensor,
                           num: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum of masked token log-probs per owner (a pair side may span several sequences when a
    multi-turn context was rewritten): returns (logp_P, tokens_P), each [num]."""
    per_seq = torch.where(mask_BT > 0, logp_BT, torch.zeros_like(logp_BT)).sum(-1)
    logp = torch.zeros(num, dtype=per_seq.dtype, device=per_seq.device).index_add(0, owner_B.to(per_seq.device), per_seq)
    count = torch.zeros(num, dtype=mask_BT.dtype, device=mask_BT.device).index_add(0, owner_B.to(mask_BT.device), mask_BT.sum(-1))
    return logp, count


def _log_ratio_margin(inp: PreferenceInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if inp.ref_chosen_logp_P is None or inp.ref_rejected_logp_P is None:
        raise ValueError("this preference loss needs reference log-probs (ref_chosen_logp_P, ref_rejected_logp_P)")
    chosen = inp.chosen_logp_P - inp.ref_chosen_logp_P.detach()
    rejected = inp.rejected_logp_P - inp.ref_rejected_logp_P.detach()
    return chosen - rejected, chosen, rejected


def _metrics(margin_P: torch.Tensor, chosen_P: torch.Tensor, rejected_P: torch.Tensor, beta: float) -> Metrics:
    m = margin_P.detach()
    return {"reward_margin": m.mean(), "accuracy": (m > 0).float().mean(),
            "chosen_reward": beta * chosen_P.detach().mean(), "rejected_reward": beta * rejected_P.detach().mean()}


@PREFERENCE_LOSSES.register("sigmoid")
def compute_dpo_loss(inp: PreferenceInputs, cfg) -> tuple[torch.Tensor, Metrics]:
    """DPO: -log sigma(beta h) per pair (logsigmoid: finite for any margin)."""
    h, chosen, rejected = _log_ratio_margin(inp)
    return -F.logsigmoid(cfg.beta * h), _metrics(h, chosen, rejected, cfg.beta)


@PREFERENCE_LOSSES.register("ipo")
def compute_ipo_loss(inp: PreferenceInputs, cfg) -> tuple[torch.Tensor, Metrics]:
    """IPO: (h - 1/(2 beta))^2 per pair — regresses the margin to a finite target."""
    h, chosen, rejected = _log_ratio_margin(inp)
    return (h - 1.0 / (2.0 * cfg.beta)) ** 2, _metrics(h, chosen, rejected, cfg.beta)


@PREFERENCE_LOSSES.register("simpo")
def compute_simpo_loss(inp: PreferenceInputs, cfg) -> tuple[torch.Tensor, Metrics]:
    """SimPO: -log sigma(beta (avg logp_w - avg logp_l) - gamma); no reference model."""
    if inp.chosen_len_P is None or inp.rejected_len_P is None:
        raise ValueError("simpo needs the response lengths (chosen_len_P, rejected_len_P)")
    chosen = inp.chosen_logp_P / inp.chosen_len_P.clamp(min=1)
    rejected = inp.rejected_logp_P / inp.rejected_len_P.clamp(min=1)
    z = cfg.beta * (chosen - rejected) - cfg.simpo_gamma
    return -F.logsigmoid(z), _metrics(chosen - rejected, chosen, rejected, cfg.beta)


compute_simpo_loss.reference_free = True  # the entry's fact: no reference model to build or score


def needs_reference(name: str) -> bool:
    """Whether the named loss reads reference log-probs (asked of the registry entry)."""
    return not getattr(PREFERENCE_LOSSES[name], "reference_free", False)
