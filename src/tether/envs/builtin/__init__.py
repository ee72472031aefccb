"""Built-in offline environments; importing this package registers them in ENVS and TASKS."""

from tether.envs.builtin import calc, codefix, household, qa, shop  # noqa: F401
