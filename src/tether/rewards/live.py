"""The live policy, for rewards that need it (self-critique: the policy grades its own answers).

The RL recipe registers its policy (`set_policy`) before the first step; `judge` with
`model: policy` reads it. A process-wide slot, not an argument, because reward functions have the
fixed signature `fn(texts, tasks, **kwargs)`; batched components run in the trainer's process, so
they see the current weights.
"""

from __future__ import annotations

from typing import Any

_POLICY: tuple[Any, Any] | None = None


def set_policy(model: Any, tokenizer: Any) -> None:
    global _POLICY
    _POLICY = (model, tokenizer)


def get_policy() -> tuple[Any, Any]:
    if _POLICY is None:
        raise RuntimeError("judge model=policy: no live policy registered (self-critique needs the RL recipe; "
                           "use a model directory elsewhere)")
    return _POLICY
