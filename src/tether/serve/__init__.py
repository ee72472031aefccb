"""HTTP surfaces over a policy: the OpenAI-compatible rollout endpoint (`tether.serve.endpoint`,
streamed answers in `tether.serve.sse`), which the agent harness and verifiers environments play
against, and the Tinker-compatible training service (`tether.serve.tinker`, `tether serve-tinker`).

Nothing is imported here: each surface is its own module (`from tether.serve.endpoint import RolloutServer`).
"""
