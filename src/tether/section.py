"""The base of every config section (`tether.config` assembles the sections; each package owns its own).

A section is a pydantic model that refuses unknown keys (with the nearest valid key suggested by
`tether.config_text`), refuses inf/nan, and is frozen once validated: nothing assigns into a
config during a run. What legitimately changes during a run (a health repair in force, a reward
cap, a fault under test) is a `tether.settings.RunSettings` change, which yields a new frozen
config and is checkpointed and logged.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """A frozen, strict config section: `model_copy(update=...)` makes a changed copy."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


__all__ = ["Section"]
