"""What the commands of :mod:`audiomask.cli` share: exit statuses, help text, device choice, writing lines."""

from __future__ import annotations

import re
import textwrap
from typing import TextIO

EXIT_OK, EXIT_BAD_FILE, EXIT_USAGE = 0, 1, 2
SIGNAL_EXIT_BASE = 128  # the shell's status for a process ended by signal N is 128 + N
HELP_WIDTH = 79  # characters per line of the help texts taken from the package docstring
# reST of the docstring, for plain help: :role:`~a.b.name` -> name, :role:`a.b` -> a.b, ``x`` -> x.
_REST_MARKUP = re.compile(r":\w+:`~(?:[\w.]*\.)?([^`]+)`|:\w+:`([^`]+)`|``([^`]+)``")


class OutputError(Exception):
    """A result line could not be written (stdout closed, full, or failing): nothing more can be delivered.

    The run ends with status :data:`EXIT_USAGE`, as for a closed stdout: :data:`EXIT_BAD_FILE` would say
    that the other files' results were delivered.
    """


def write_line(stream: TextIO, line: str) -> None:
    """Write ``line`` and a newline to ``stream`` and flush; a failed write raises :class:`OutputError`.

    ``BrokenPipeError`` passes through unchanged: a reader that went away
    (``| head``) is not an error of ours.
    """
    try:
        stream.write(line + "\n")
        stream.flush()
    except BrokenPipeError:
        raise
    except OSError as error:
        raise OutputError(f"cannot write to {getattr(stream, 'name', 'the output')}: {error.strerror}") from None


def plain(text: str) -> str:
    """reST paragraphs as plain text for ``--help``: markup dropped (quotes kept round literals with spaces).

    >>> plain("Streams through the\\n:class:`~audiomask.asr.recognizer.StreamingRecognizer`; ``-`` is stdin.")
    'Streams through the StreamingRecognizer; - is stdin.'
    >>> plain("One line ``audiomask: error: FILE`` each (:mod:`audiomask.audio`).")
    "One line 'audiomask: error: FILE' each (audiomask.audio)."
    """
    text = _REST_MARKUP.sub(lambda m: m[1] or m[2] or (f"'{m[3]}'" if " " in m[3] else m[3]), text)
    return "\n\n".join(textwrap.fill(" ".join(paragraph.split()), HELP_WIDTH) for paragraph in text.split("\n\n"))
