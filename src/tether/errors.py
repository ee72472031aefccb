"""The one marker for problems the user can fix: bad config, data, paths, model directories.

`tether` (cli.py) turns any `UserError` into a one-line message and exit code 2, with no
traceback (unless `--debug`); anything else is a bug or a run failure (exit 1). The concrete
classes live next to the code that raises them (`ConfigError`, `DataError`, `TemplateError`,
`UnknownNameError`, ...) and inherit from `UserError` as well as their usual base.
"""

from __future__ import annotations


class UserError(Exception):
    """A problem with the user's input; the message names the key/file/line and the fix."""


class InputError(UserError, ValueError):
    """A problem found by the checks that run before a model is built (tether.preflight)."""
