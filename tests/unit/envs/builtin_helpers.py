"""Shared checks for the built-in environments: play the scripted expert through the batched
rollout (a scripted sampler replays its actions) and compare with the direct expert episode."""

from __future__ import annotations

from env_stubs import encode_action

from tether.config import EnvConfig, SamplingConfig
from tether.envs import run_expert_episode
from tether.rollout.episodes import EpisodeRollout


def expert_actions(problems, noise: float = 0.0, rng=None) -> dict[str, list[str]]:
    out = {}
    for p in problems:
        history, _, _ = run_expert_episode(p, 16, noise, rng)
        out[p["prompt"]] = [m.content for m in history if m.role == "assistant"]
    return out


def run_expert_rollouts(policy, scripted, problems, env_cfg: EnvConfig | None = None, actions=None):
    """The expert's actions replayed by a scripted sampler through `run_env_rollouts`."""
    tok = policy.tokenizer
    actions = actions or expert_actions(problems)

    def act(call, row, prompt):
        text = tok.decode(list(prompt))
        key = next(k for k in actions if k in text)
        seq = actions[key]
        return encode_action(tok, seq[min(call, len(seq) - 1)])

    gen = scripted(act, policy.stop_ids)
    return EpisodeRollout(env_cfg or EnvConfig()).run(
        policy, problems, 1, SamplingConfig(max_new_tokens=96), generate=gen)
