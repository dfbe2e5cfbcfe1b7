"""User-facing errors.

Every problem a user can cause (bad path, bad config, bad text) raises a subclass of
:class:`SuperBPEError` with a one-line message, so command-line entry points can print it
without a traceback. It derives from ``ValueError`` so callers that expect the usual
Python exception for a bad argument still catch it.
"""

from __future__ import annotations


class SuperBPEError(ValueError):
    """A bad input or configuration, explained in one line."""


class InputError(SuperBPEError):
    """A corpus path, file or text that cannot be used."""


class ConfigError(SuperBPEError):
    """An option or combination of options that cannot be honoured."""
