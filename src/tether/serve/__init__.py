"""HTTP surfaces over a policy: the OpenAI-compatible rollout endpoint (`tether.serve.endpoint`),
which the agent harness and verifiers environments play against.

Nothing is imported here: each surface is its own module (`from tether.serve.endpoint import RolloutServer`).
"""
