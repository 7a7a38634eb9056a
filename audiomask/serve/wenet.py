"""WeNet's WebSocket protocol (its runtime's ``websocket_server``), at ``/wenet``.

The client sends the start signal ``{"signal": "start", "nbest": 1,
"continuous_decoding": false}`` and the server answers ``{"status": "ok",
"type": "server_ready"}``; then binary messages of **little-endian int16** PCM,
mono, 16 kHz (not float32: that is the sherpa-onnx route, ``/``); then
``{"signal": "end"}``. The server sends ``partial_result`` each time the
recognizer has new output and, after the end signal, ``final_result`` and ``speech_end``, then
closes with code 1000. ``nbest`` is a JSON *string* of ``[{"sentence": ...}]``
(greedy decoding: one hypothesis whatever ``nbest`` asks). With
``"continuous_decoding": true`` the audio is cut into segments at
voice-activity endpoints (as WeNet's server does): each segment's text ends
with a ``final_result``, and the next one's ``partial_result`` starts afresh.
Errors are ``{"status": "failed", "message": ...}``, then a close frame.

>>> from audiomask.asr.transcript import Transcript
>>> from audiomask.serve.segments import Segment
>>> protocol = WeNetProtocol()
>>> protocol.read_text('{"signal": "start", "nbest": 1, "continuous_decoding": false}').messages
('{"status": "ok", "type": "server_ready"}',)
>>> protocol.result(Segment(0, Transcript("hello"), start_s=0.0, final=False))
('{"status": "ok", "type": "partial_result", "nbest": "[{\\\\"sentence\\\\": \\\\"hello\\\\"}]"}',)
>>> protocol.read_bytes(b"\\x00\\x40").samples   # int16 16384 = 0.5 of full scale
array([0.5], dtype=float32)
"""

from __future__ import annotations

import json

import numpy as np

from audiomask.serve.segments import Segment, TextChanges
from audiomask.serve.session import END, ClientError, ClientProtocol, End, Reply, Samples
from audiomask.serve.settings import Endpointing, ServeSettings

__all__ = ["INT16_FULL_SCALE", "INT16_LE", "WeNetProtocol"]

INT16_LE = np.dtype("<i2")
INT16_FULL_SCALE = 32768.0  # int16 PCM / this = float samples in [-1, 1) (as soundfile reads PCM16 files)
SAMPLE_FORMAT = "little-endian int16 PCM at 16 kHz (float32 samples go to /)"
START_EXAMPLE = '{"signal": "start", "nbest": 1, "continuous_decoding": false}'
SHOWN_CHARS = 40  # an error message quotes at most this much of the client's message


class WeNetProtocol(ClientProtocol):
    """The route ``/wenet``: start signal, int16 PCM, end signal; ``partial_result`` / ``final_result``."""

    sample_format = SAMPLE_FORMAT

    def __init__(self) -> None:
        self.started = False
        self.continuous = False  # continuous_decoding: segments at endpoints
        self._texts = TextChanges()

    def endpointing(self, settings: ServeSettings) -> Endpointing:
        return settings.endpointing if self.continuous else (None, None)

    def read_text(self, text: str) -> Samples | Reply | End:
        """The event of a start or end signal; :class:`ClientError` (close 1007) for any other text, JSON that
        cannot be read (malformed, or nested deeper than the parser's recursion limit) included."""
        try:
            message = json.loads(text)
        except ValueError:
            raise ClientError(f"text message {_shown(text)} is not JSON: send {START_EXAMPLE}") from None
        except RecursionError:
            raise ClientError(f"text message {_shown(text)} is JSON nested too deep: send {START_EXAMPLE}") from None
        if not isinstance(message, dict) or "signal" not in message:
            raise ClientError(
                f'a text message must be a JSON object with a "signal" ("start" or "end"), got {_shown(text)}'
            )
        signal = message["signal"]
        if signal == "start":
            return self._start(message)
        if signal == "end":
            if not self.started:
                raise ClientError(f"end signal before the start signal: send {START_EXAMPLE} first")
            return END
        raise ClientError(f'unexpected signal {_shown(signal)}: expected "start" or "end"')

    def _start(self, message: dict) -> Reply:
        if self.started:
            raise ClientError("a second start signal: one connection carries one utterance")
        nbest = message.get("nbest", 1)
        if isinstance(nbest, bool) or not isinstance(nbest, int) or nbest < 1:
            raise ClientError(f"nbest must be a positive integer, got {_shown(nbest)}")
        continuous = message.get("continuous_decoding", False)
        if not isinstance(continuous, bool):
            raise ClientError(f"continuous_decoding must be true or false, got {_shown(continuous)}")
        self.started, self.continuous = True, continuous
        return Reply((json.dumps({"status": "ok", "type": "server_ready"}),))

    def read_bytes(self, data: bytes) -> Samples | Reply | End:
        if not self.started:
            raise ClientError(f"the start signal is expected before binary data: send {START_EXAMPLE} first")
        if len(data) % INT16_LE.itemsize:
            raise ClientError(
                f"a binary message of {len(data)} bytes is not a whole number of int16 samples "
                f"({INT16_LE.itemsize} bytes each): this route takes {SAMPLE_FORMAT}"
            )
        return Samples(np.frombuffer(data, INT16_LE).astype(np.float32) / np.float32(INT16_FULL_SCALE))

    def result(self, segment: Segment) -> tuple[str, ...]:
        if not self._texts.changed(segment):
            return ()
        return (_result("final_result" if segment.final else "partial_result", segment.transcript.text),)

    def final(self, segment: Segment) -> tuple[str, ...]:
        return _result("final_result", segment.transcript.text), json.dumps({"status": "ok", "type": "speech_end"})

    def error(self, message: str) -> str:
        return json.dumps({"status": "failed", "message": message})


def _shown(value: object) -> str:
    """``value`` as an error message quotes it: its JSON (a string's ``repr``), cut to :data:`SHOWN_CHARS`."""
    try:
        shown = repr(value) if isinstance(value, str) else json.dumps(value)
    except RecursionError:  # parsed just under the recursion limit, and written from a deeper frame
        return f"a JSON {'array' if isinstance(value, list) else 'object'} nested too deep"
    return shown if len(shown) <= SHOWN_CHARS else shown[:SHOWN_CHARS] + "..."


def _result(kind: str, text: str) -> str:
    return json.dumps({"status": "ok", "type": kind, "nbest": json.dumps([{"sentence": text}])})
