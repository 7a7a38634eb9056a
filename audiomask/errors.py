"""The exceptions audiomask raises for bad input.

Bad arguments raise :class:`ValueError` whose message names the argument and
the value it had. Bad audio raises :class:`AudioError`, a ``ValueError``
subclass, so one ``except ValueError`` catches every user error; the CLI turns
either into one line on stderr.
"""

from __future__ import annotations

__all__ = ["AudioError"]


class AudioError(ValueError):
    """Audio that cannot be used: missing, unreadable, empty, or non-finite.

    The message names the file (or stream) and the reason.
    """
