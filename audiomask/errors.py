"""The exceptions audiomask raises for bad input, and the warnings it gives when it degrades.

Bad arguments raise :class:`ValueError` whose message names the argument and
the value it had. Bad audio raises :class:`AudioError`, a ``ValueError``
subclass, so one ``except ValueError`` catches every user error; the CLI turns
either into one line on stderr. :class:`PinnedMemoryWarning` says that a
transfer buffer could not be page-locked and works on pageable memory instead.
"""

from __future__ import annotations

__all__ = ["AudioError", "PinnedMemoryWarning"]


class AudioError(ValueError):
    """Audio that cannot be used: missing, unreadable, empty, or non-finite.

    The message names the file (or stream) and the reason.
    """


class PinnedMemoryWarning(RuntimeWarning):
    """Page-locking host memory failed (locked-memory limit, no driver): pageable memory is used instead.

    Copies still land intact, but a ``non_blocking`` copy from pageable memory
    makes the host wait for the GPU queue: expect stalls.
    """
