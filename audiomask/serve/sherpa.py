"""sherpa-onnx's online WebSocket protocol (its ``streaming_server.py`` and C++ ``online-websocket-server``).

The client sends binary messages of **little-endian float32** mono samples in
[-1, 1] at 16 kHz, of any length (not int16: that is WeNet's route,
``/wenet``), and then the text message ``Done``. The server sends a JSON text
message each time the recognizer has new output (a CTC token, an LLM
update), then, after ``Done``, the final result with ``is_final`` and
``is_eof`` true, then the text message ``Done!``, and closes with code 1000:

>>> from audiomask.asr.transcript import Transcript
>>> from audiomask.serve.segments import Segment
>>> protocol = SherpaProtocol()
>>> protocol.read_text("Done")
END
>>> protocol.result(Segment(0, Transcript("hi", ("h", "i"), (0.28, 0.36)), start_s=0.0, final=False))
('{"text": "hi", "segment": 0, "is_final": false, "is_eof": false, "tokens": ["h", "i"], "timestamps": [0.28, 0.36], "start_time": 0.0}',)
>>> protocol.result(Segment(0, Transcript("hi", ("h", "i"), (0.28, 0.36)), start_s=0.0, final=False, end_s=1.2))
()
>>> protocol.final(Segment(1, Transcript("yo", ("y", "o"), (0.1, 0.2)), start_s=2.4, final=True))
('{"text": "yo", "segment": 1, "is_final": true, "is_eof": true, "tokens": ["y", "o"], "timestamps": [0.1, 0.2], "start_time": 2.4}', 'Done!')
>>> protocol.read_bytes(b"\\x00\\x00")
Traceback (most recent call last):
...
audiomask.serve.session.ClientError: a binary message of 2 bytes is not a whole number of float32 samples (4 bytes each): \
an odd number of 16-bit values looks like int16 PCM; this route takes little-endian float32 samples in [-1, 1] at 16 kHz \
(int16 PCM goes to /wenet)

Endpoints split a connection's speech into segments (voice-activity
detection, ``--endpoint-silence-s``; :mod:`audiomask.serve.segments`): a
segment's last result has ``is_final`` true (``is_eof`` false), and the next
segment's ``text`` starts afresh, its ``segment`` one more and ``start_time``
where it starts (seconds from the stream's start). A result is sent each time
the recognizer reports a segment's text (a CTC token said, an LLM update), and
once with its final text. ``tokens`` are the segment's tokens (characters, for the
shipped model) and ``timestamps`` when each starts, seconds from
``start_time`` (where greedy CTC emitted it: :class:`~audiomask.asr.transcript.Transcript`).
A client error gets ``{"error": MESSAGE}``, then a close frame whose code
says which error.
"""

from __future__ import annotations

import json

import numpy as np

from audiomask.serve.segments import Segment, TextChanges
from audiomask.serve.session import CLOSE_UNSUPPORTED, END, ClientError, ClientProtocol, End, Reply, Samples
from audiomask.serve.settings import Endpointing, ServeSettings

__all__ = ["DONE", "DONE_REPLY", "FLOAT32_LE", "SherpaProtocol"]

DONE = "Done"  # the client's last message
DONE_REPLY = "Done!"  # the server's last message, after the final result
FLOAT32_LE = np.dtype("<f4")
INT16_BYTES = 2
SAMPLE_FORMAT = "little-endian float32 samples in [-1, 1] at 16 kHz (int16 PCM goes to /wenet)"


class SherpaProtocol(ClientProtocol):
    """The route ``/``: float32 samples, ``Done``, JSON results, ``Done!``."""

    sample_format = SAMPLE_FORMAT
    bad_samples_hint = f"; this route takes {SAMPLE_FORMAT}: int16 PCM read as float32 gives such values"

    def __init__(self) -> None:
        self._texts = TextChanges()

    def endpointing(self, settings: ServeSettings) -> Endpointing:
        return settings.endpointing

    def read_text(self, text: str) -> Samples | Reply | End:
        if text == DONE:
            return END
        shown = text if len(text) <= 40 else text[:40] + "..."
        raise ClientError(
            f"unexpected text message {shown!r}: this route takes binary messages of {SAMPLE_FORMAT}, "
            f"then the text message {DONE!r}",
            CLOSE_UNSUPPORTED,
        )

    def read_bytes(self, data: bytes) -> Samples | Reply | End:
        if len(data) % FLOAT32_LE.itemsize:
            int16_hint = "an odd number of 16-bit values looks like int16 PCM; " if len(data) % INT16_BYTES == 0 else ""
            raise ClientError(
                f"a binary message of {len(data)} bytes is not a whole number of float32 samples "
                f"({FLOAT32_LE.itemsize} bytes each): {int16_hint}this route takes {SAMPLE_FORMAT}"
            )
        return Samples(np.frombuffer(data, FLOAT32_LE))

    def result(self, segment: Segment) -> tuple[str, ...]:
        return (_result(segment, eof=False),) if self._texts.changed(segment) else ()

    def final(self, segment: Segment) -> tuple[str, ...]:
        return _result(segment, eof=True), DONE_REPLY

    def error(self, message: str) -> str:
        return json.dumps({"error": message})


def _result(segment: Segment, *, eof: bool) -> str:
    """sherpa-onnx's result JSON (``OnlineRecognizerResult.AsJsonString``) for ``segment``."""
    transcript = segment.transcript
    return json.dumps(
        {
            "text": transcript.text,
            "segment": segment.index,
            "is_final": segment.final or eof,
            "is_eof": eof,
            "tokens": list(transcript.tokens),
            "timestamps": list(transcript.times_s),
            "start_time": segment.start_s,
        }
    )
