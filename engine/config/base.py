"""The config's shared ground: :class:`ConfigError`, the constrained field types every section
uses (``PosInt``, ``NonNegInt``, ``PosFloat``), the bounds some fields check against, ``doc`` (a
field's documentation) and ``Section`` (the base of every section).

Invariant: every section derives from ``Section`` — keyword-only and ``forbid_unknown_fields``,
so an unknown key is an error, never a silent default — and documents every field with ``doc``.
It imports no other shunter module (the rest of ``engine/config`` imports it).
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta


class ConfigError(ValueError):
    """A configuration that cannot run; the message names the field and the values."""


PosInt = Annotated[int, Meta(ge=1)]
NonNegInt = Annotated[int, Meta(ge=0)]
PosFloat = Annotated[float, Meta(gt=0)]
MIN_GENERATE_TIMEOUT_S = 1.0
"""``rollout.generate_timeout_s``'s floor: a generation stream beats every tenth of it
(``engine.replica.heartbeat``), each beat one Ray call (about 1.3 ms on 2 cores), so at most 10 beats a
second a stream — never a flood of beats that starves the loop it reports from."""
MAX_GENERATE_TIMEOUT_S = 7 * 86400.0
"""...and its ceiling (a week): a finite bound on a hung replica's silence (``inf`` was taken)."""
MAX_TURNS = 256
"""``task.max_turns`` at most: more environment steps than any token budget holds."""
MAX_ENV_TIMEOUT_S = 86400.0
"""``task.env_timeout_s`` at most (a day): a larger (or infinite) limit bounds nothing."""


def doc(text: str, **kw: Any) -> Meta:
    return Meta(description=text, **kw)


class Section(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    pass
