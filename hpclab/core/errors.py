"""Every exception hpclab raises on purpose, in one place.

Each message is one sentence a user can act on: it names the field or part, the value seen and
what to do instead. Callers catch :class:`HpclabError` to tell these apart from bugs, which are
left to raise with their traceback.
"""

from __future__ import annotations


class HpclabError(Exception):
    """Base of every error hpclab raises on purpose; the message says what to change."""


class ConfigError(HpclabError, ValueError):
    """A configuration value is not allowed. The message names the field, the value and the rule."""


class LabError(HpclabError, RuntimeError):
    """The lab cannot do what was asked; the message says what to do instead."""


class RecordError(HpclabError, ValueError):
    """A file in a run folder is half-written, foreign or not what hpclab wrote; the message
    names the file. Listings skip such a run with one warning; reading it by name raises."""


class RunFailed(HpclabError, RuntimeError):
    """A run ended as failed or diverged; the message says why and what to do."""


__all__ = ["HpclabError", "ConfigError", "LabError", "RecordError", "RunFailed"]
