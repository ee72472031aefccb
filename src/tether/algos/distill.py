"""On-policy distillation: the per-token reverse KL to a teacher as a dense advantage.

The student samples y ~ pi_s; a teacher scores the same token ids. For each sampled token,
    k1_t = log pi_s(y_t | y_<t) - log pi_T(y_t | y_<t)
is a single-sample estimate of the per-token reverse KL, KL(pi_s || pi_T), and the advantage is
its negative: A_t = -k1_t = log pi_T(y_t) - log pi_s(y_t) (no discounting, no baseline: each token
is credited only with its own term). Minimising the reverse KL is mode seeking: the student
concentrates on what the teacher rates likely (Gu et al., MiniLLM, arXiv 2306.08543 §2; Agarwal
et al., GKD, arXiv 2306.13649 §3; Thinking Machines' "On-Policy Distillation", 2025, which uses
exactly this per-token advantage with a discount of zero). Used with the policy-gradient loss of
the RL update, the expected gradient is the reverse KL's gradient.

Shapes: [B,T] right-padded; mask_BT is 1 on the student's action tokens only.
"""

from __future__ import annotations

import torch


def compute_reverse_kl_advantages(student_logp_BT: torch.Tensor, teacher_logp_BT: torch.Tensor,
                                  mask_BT: torch.Tensor, kl_coef: float = 1.0) -> torch.Tensor:
    """A_t = kl_coef * (log pi_T(y_t) - log pi_s(y_t)) on masked tokens, exactly 0 elsewhere."""
    diff_BT = teacher_logp_BT.detach().float() - student_logp_BT.detach().float()
    return torch.where(mask_BT > 0, kl_coef * diff_BT, torch.zeros_like(diff_BT))
