"""Where ``audiomask transcribe`` puts results, partial texts, progress, warnings and errors."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path
from typing import Any, TextIO

from audiomask.cli.common import OutputError, write_line

__all__ = ["Output", "escape", "reason"]

PROGRESS_MIN_AUDIO_S = 10.0  # on a terminal, one file this long (or several files) gets a progress line
# Characters that would break the one-line, tab-separated text format, and how they are written.
_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def escape(name: str) -> str:
    """``name`` for a ``FILE<TAB>TEXT`` line: backslash, tab, newline and carriage return as ``\\\\ \\t \\n \\r``.

    >>> print(escape("take\\t1\\nfinal.wav"))
    take\\t1\\nfinal.wav
    >>> print(escape("C:\\\\a.wav"))
    C:\\\\a.wav
    """
    return name.translate(_ESCAPES)


def reason(message: str, path: Path) -> str:
    """``message`` without the leading ``"{path}: "`` the audio reader puts on its errors and warnings."""
    return message.removeprefix(f"{path}: ")


class Output:
    """Where results, partial texts, progress, warnings and errors go (the module docstring's contract)."""

    def __init__(self, *, json_lines: bool, partials: bool, files: int, stdout: TextIO, stderr: TextIO) -> None:
        self.json_lines, self.partials, self.files = json_lines, partials, files
        self.stdout, self.stderr = stdout, stderr
        self.live = stderr.isatty()  # a terminal: one status line, rewritten in place
        self._status_shown = False
        self._file: tuple[int, str, float | None] = (0, "", None)  # index, name, expected seconds
        self._text = ""

    def _emit(self, stream: TextIO, line: str) -> None:
        self._clear_status()
        if stream is self.stdout:
            write_line(stream, line)
            return
        try:
            write_line(stream, line)
        except OutputError:  # diagnostics that cannot be shown do not stop the results
            pass

    def _json(self, **fields: Any) -> None:
        self._emit(self.stdout, json.dumps(fields, ensure_ascii=False))

    def _clear_status(self) -> None:
        if self._status_shown:
            self.stderr.write("\r\x1b[K")
            self.stderr.flush()
            self._status_shown = False

    def start(self, index: int, name: str, path: Path | None) -> None:
        """File ``index`` (0-based) begins; its length (for the progress line) is read from the header of ``path``.

        ``path`` is ``None`` for a stream (stdin, a pipe), whose length is unknown.
        """
        expected = None
        if self.live and path is not None:
            import soundfile

            try:
                expected = soundfile.info(str(path)).duration
            except (RuntimeError, OSError):  # unreadable: the reader reports why, once, when it gets there
                pass
        self._file, self._text = (index, name, expected), ""

    def update(self, audio_s: float, text: str) -> None:
        """``audio_s`` seconds of the current file read so far, ``text`` recognised so far."""
        grew, self._text = text != self._text, text
        index, name, expected = self._file
        if self.partials and grew and self.json_lines:
            self._json(kind="partial", file=name, text=text, audio_s=round(audio_s, 3))
        elif self.partials and grew and not self.live:
            self._emit(self.stderr, f"partial\t{escape(name)}\t{text}")
        progress = self.files > 1 or (expected or 0.0) >= PROGRESS_MIN_AUDIO_S
        if not self.live or not (progress or (self.partials and not self.json_lines)):
            return
        line = f"{escape(name)}:"
        if progress:
            total = f"/{expected:.1f}" if expected else ""
            line = f"[{index + 1}/{self.files}] {escape(name)} {audio_s:.1f}{total} s"
        width = shutil.get_terminal_size().columns - 1
        if self.partials and not self.json_lines and text:
            room = width - len(line) - 2
            shown = text if len(text) <= room else "…" + text[len(text) - room + 1 :]
            line = f"{line}  {shown}" if room > 1 else line
        self.stderr.write("\r\x1b[K" + line[:width])
        self.stderr.flush()
        self._status_shown = True

    def result(self, name: str, text: str, duration_s: float, processing_s: float, interrupted: bool = False) -> None:
        """A file's final text (or its text so far, ``interrupted``)."""
        if self.json_lines:
            rtf = round(processing_s / duration_s, 4) if duration_s else None
            self._json(
                kind="final",
                file=name,
                text=text,
                duration_s=round(duration_s, 3),
                processing_s=round(processing_s, 4),
                rtf=rtf,
                interrupted=interrupted,
            )
        else:
            mark = f"\t[interrupted at {duration_s:.1f} s]" if interrupted else ""
            self._emit(self.stdout, f"{escape(name)}\t{text}{mark}")

    def error(self, name: str, reason: str) -> None:
        """One line ``audiomask: error: NAME: REASON`` on stderr."""
        self._emit(self.stderr, f"audiomask: error: {escape(name)}: {escape(reason)}")

    def warnings(self, name: str, path: Path, caught: list[warnings.WarningMessage]) -> None:
        """Print the warnings caught so far as one line each (naming the file), and forget them."""
        for warning in caught:
            message = str(warning.message)
            about = f"{name}: {reason(message, path)}" if message.startswith(f"{path}: ") else message
            self._emit(self.stderr, f"audiomask: warning: {escape(about)}")
        caught.clear()

    def finish(self) -> None:
        """Clear the terminal's status line."""
        self._clear_status()
