"""``/v1/realtime``: OpenAI's Realtime transcription protocol, and vLLM's realtime dialect, on one route.

Both send JSON text frames with base64 PCM16 audio; they differ in events,
and the first event a client sends tells which it speaks (a hint from the
handshake decides when it is an append): OpenAI's ``session.update`` holds a
``session`` object (``transcription_session.update`` in the older beta
spelling); vLLM's has a top-level ``model``, or the client commits first.

**OpenAI** (its API reference and official SDK, ``client.realtime.connect(
extra_query={"intent": "transcription"})``): the server greets with
``session.created``; ``session.update`` (a partial update of
``audio.input``: ``format`` ``audio/pcm`` at 24 kHz, or 16 kHz; the beta's
``input_audio_format: "pcm16"``; ``turn_detection`` ``null`` or
``server_vad`` with ``threshold``, ``prefix_padding_ms``,
``silence_duration_ms``) is answered with ``session.updated``;
``input_audio_buffer.append`` (base64) adds audio, ``.commit`` ends the
utterance (an *item*), ``.clear`` drops the audio not committed. Per item
the server sends ``input_audio_buffer.speech_started`` and
``.speech_stopped`` (server VAD), ``.committed``, ``conversation.item.added``
(``.created`` to a beta client),
``conversation.item.input_audio_transcription.delta`` as the text grows
(streamed while the audio comes, not only after the commit) and
``.completed`` with the item's final text, then ``conversation.item.done``.
A bad event gets an ``error`` event (with the client's ``event_id``) and the
connection goes on. The transcription ``model``, ``language`` and ``prompt``
a session asks for are echoed; the server's own model, ``--language`` and
``--context`` transcribe.

**vLLM** (its ``/v1/realtime``): ``session.created`` (``id``, ``created``);
``session.update`` with ``model``; ``input_audio_buffer.commit`` starts,
``input_audio_buffer.append`` adds PCM16 at 16 kHz, and a commit with
``"final": true`` ends the audio: the server sends ``transcription.delta``
events as the text grows and ``transcription.done`` with the final text.
Errors are ``{"type": "error", "error": MESSAGE, "code": CODE}``; the
connection goes on.
"""

from __future__ import annotations

import binascii
import json
import secrets
import time
from collections.abc import Mapping

import numpy as np
import pybase64

from audiomask.resample import Resampler
from audiomask.serve.segments import Segment
from audiomask.serve.session import Clear, ClientProtocol, Commit, End, Reply, Samples
from audiomask.serve.settings import Endpointing, ServeSettings
from audiomask.vad.endpoints import DEFAULT_PREFIX_PADDING_MS, DEFAULT_SILENCE_MS, MS_PER_S, VADSettings

__all__ = ["OPENAI", "OPENAI_RATE", "REALTIME_ROUTE", "VLLM", "VLLM_RATE", "RealtimeProtocol", "openai_hint"]

REALTIME_ROUTE = "/v1/realtime"
OPENAI, VLLM = "openai", "vllm"  # the dialects
OPENAI_RATE = 24_000  # Hz of OpenAI's audio/pcm (and the beta's pcm16)
VLLM_RATE = 16_000  # Hz of vLLM's PCM16
RATES = (OPENAI_RATE, VLLM_RATE)  # the PCM rates a session may ask for
INT16_FULL_SCALE = 32768.0
ID_CHARS = 21  # OpenAI's ids: a prefix and 21 letters and digits (here hex digits: ids are opaque to clients)
SHOWN_CHARS = 60  # an error message quotes at most this much of the client's event


def _new_id(prefix: str) -> str:
    """``prefix`` and :data:`ID_CHARS` random hex digits (one call: every event sent takes an id)."""
    return prefix + secrets.token_hex(-(-ID_CHARS // 2))[:ID_CHARS]


class _EventError(Exception):
    """A bad event: answered with an ``error`` event, and the connection goes on."""

    def __init__(self, message: str, code: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code, self.param = code, param


class _Item:
    """What the client has been told of one segment (an OpenAI item)."""

    __slots__ = ("committed", "id", "sent")

    def __init__(self) -> None:
        self.id = _new_id("item_")
        self.sent = ""  # the text its deltas have carried
        self.committed = False


class RealtimeProtocol(ClientProtocol):
    """One ``/v1/realtime`` connection, in whichever dialect its client speaks (see the module docstring).

    Args:
        settings: the server's options (its VAD threshold, longest segment).
        openai_hint: the handshake looks like OpenAI's SDK (``intent`` or ``model`` in the query, or an
            ``Authorization`` header): an append before any other event is OpenAI's.
    """

    sample_format = "base64 PCM16 in input_audio_buffer.append events (JSON text messages)"

    def __init__(self, settings: ServeSettings, *, openai_hint: bool = False) -> None:
        self.settings = settings
        self.dialect: str | None = None  # decided by the first event
        self._openai_hint = openai_hint
        self._beta = False  # the client spoke the beta's transcription_session.update
        self._model: str | None = None  # vLLM: the model its session.update named
        self._session_id = _new_id("sess_")
        self._rate = OPENAI_RATE
        self._transcription: dict = {"model": "audiomask", "language": None, "prompt": ""}
        self._turn_detection: dict | None = {
            "type": "server_vad",
            "threshold": settings.vad_threshold,
            "prefix_padding_ms": DEFAULT_PREFIX_PADDING_MS,
            "silence_duration_ms": DEFAULT_SILENCE_MS,
        }
        self._resampler: Resampler | None = None
        self._audio_started = False  # audio has been appended: the endpointing is fixed
        self._uncommitted = 0  # samples appended since the last commit or clear
        self._items: dict[int, _Item] = {}  # by segment index
        self._previous_item: str | None = None  # the item committed last
        self._event_id: str | None = None  # the client's event being answered

    # -- what the session asks -------------------------------------------------------------------

    def greeting(self) -> tuple[str, ...]:
        """``session.created``, in a form both dialects read (vLLM reads ``id``; OpenAI ``session``)."""
        return (self._event("session.created", session=self._session(), id=self._session_id, created=int(time.time())),)

    def endpointing(self, settings: ServeSettings) -> Endpointing:
        """How the connection's audio is cut into items: by the session's ``turn_detection`` (OpenAI), or
        only by commits (OpenAI's ``turn_detection: null``; vLLM's final commit)."""
        detection = self._turn_detection if self.dialect != VLLM else None
        if detection is None:
            return None, None
        vad = VADSettings(
            float(detection.get("threshold", settings.vad_threshold)),
            int(detection.get("silence_duration_ms", DEFAULT_SILENCE_MS)),
            int(detection.get("prefix_padding_ms", DEFAULT_PREFIX_PADDING_MS)),
        )
        return vad, float(settings.max_segment_s)

    def read_text(self, text: str) -> Samples | Reply | End | Commit | Clear:
        try:
            event = json.loads(text)
        except (ValueError, RecursionError):
            return self._refuse(_EventError(f"the message is not JSON: {text[:SHOWN_CHARS]!r}", "invalid_json"))
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            return self._refuse(_EventError("an event must be a JSON object with a string 'type'", "invalid_event"))
        self._event_id = event.get("event_id") if isinstance(event.get("event_id"), str) else None
        kind = event["type"]
        if self.dialect is None:
            self.dialect = self._dialect_of(event)
        try:
            if kind in ("session.update", "transcription_session.update"):
                return self._update(event)
            if kind == "input_audio_buffer.append":
                return self._append(event)
            if kind == "input_audio_buffer.commit":
                return self._commit(event)
            if kind == "input_audio_buffer.clear" and self.dialect == OPENAI:
                return self._clear()
        except _EventError as refusal:
            return self._refuse(refusal)
        return self._refuse(_EventError(f"Unknown event type: {kind[:SHOWN_CHARS]}", "unknown_event", "type"))

    def read_bytes(self, data: bytes) -> Samples | Reply | End | Commit | Clear:
        return self._refuse(
            _EventError(
                f"a binary message of {len(data)} bytes: this route takes JSON text events, the audio base64 "
                "in input_audio_buffer.append",
                "invalid_event",
            )
        )

    def result(self, segment: Segment) -> tuple[str, ...]:
        messages = []
        item = self._items.get(segment.index)
        if item is None:
            item = self._items[segment.index] = _Item()
            if self.dialect == OPENAI and self._turn_detection is not None:
                start_ms = round(segment.start_s * MS_PER_S)
                messages.append(
                    self._event("input_audio_buffer.speech_started", audio_start_ms=start_ms, item_id=item.id)
                )
        messages += self._delta(item, segment.transcript.text)
        if segment.end_s is not None and not item.committed:
            item.committed = True
            self._uncommitted = 0  # (under server VAD) what was appended went to this item
            messages += self._committed(item, segment)
        if segment.final:
            messages += self._completed(item, segment)
            del self._items[segment.index]
        return tuple(messages)

    def final(self, segment: Segment) -> tuple[str, ...]:
        """The connection ends (the server drains): the last item's text, if it had audio."""
        if segment.index not in self._items:
            return ()
        return self.result(segment)

    def error(self, message: str) -> str:
        return self._error_event(message, "server_error" if self.dialect == OPENAI else "processing_error")

    # -- events ----------------------------------------------------------------------------------

    def _dialect_of(self, event: dict) -> str:
        kind = event["type"]
        if kind == "transcription_session.update" or isinstance(event.get("session"), dict):
            return OPENAI
        if kind == "session.update" or (kind == "input_audio_buffer.commit" and not self._openai_hint):
            return VLLM
        if "final" in event:
            return VLLM
        return OPENAI if self._openai_hint else VLLM

    def _update(self, event: dict) -> Reply:
        if self.dialect == VLLM:
            model = event.get("model")
            if not isinstance(model, str) or not model:
                raise _EventError("Missing required field: model", "invalid_event", "model")
            self._model = model
            return Reply(())
        session = event.get("session")
        if not isinstance(session, dict):
            raise _EventError("session.update needs a 'session' object", "invalid_event", "session")
        if event["type"] == "transcription_session.update":
            self._beta = True
            self._update_beta(session)
        else:
            if session.get("type", "transcription") != "transcription":
                raise _EventError(
                    f"session.type {session.get('type')!r}: this server transcribes ('transcription' sessions only)",
                    "invalid_value",
                    "session.type",
                )
            audio = session.get("audio") or {}
            self._update_input(audio.get("input") or {} if isinstance(audio, dict) else {})
        kind = "transcription_session.updated" if self._beta else "session.updated"
        return Reply((self._event(kind, session=self._session()),))

    def _update_input(self, given: dict) -> None:
        if "format" in given:
            audio_format = given["format"] or {}
            rate = audio_format.get("rate", OPENAI_RATE) if isinstance(audio_format, dict) else None
            if not isinstance(audio_format, dict) or audio_format.get("type") != "audio/pcm" or rate not in RATES:
                raise _EventError(
                    f"audio.input.format {json.dumps(audio_format)[:SHOWN_CHARS]}: this server takes "
                    f"{{'type': 'audio/pcm', 'rate': {OPENAI_RATE}}} (or {VLLM_RATE}); G.711 is not supported",
                    "invalid_value",
                    "session.audio.input.format",
                )
            self._set_rate(rate)
        if "transcription" in given:
            self._set_transcription(given["transcription"], "session.audio.input.transcription")
        if "turn_detection" in given:
            self._set_turn_detection(given["turn_detection"], "session.audio.input.turn_detection")

    def _update_beta(self, session: dict) -> None:
        if "input_audio_format" in session:
            if session["input_audio_format"] != "pcm16":
                raise _EventError(
                    f"input_audio_format {session['input_audio_format']!r}: this server takes 'pcm16' (24 kHz)",
                    "invalid_value",
                    "session.input_audio_format",
                )
            self._set_rate(OPENAI_RATE)
        if "input_audio_transcription" in session:
            self._set_transcription(session["input_audio_transcription"], "session.input_audio_transcription")
        if "turn_detection" in session:
            self._set_turn_detection(session["turn_detection"], "session.turn_detection")

    def _set_rate(self, rate: int) -> None:
        if rate != self._rate and self._audio_started:
            raise _EventError("the audio format can change only before the first audio", "invalid_value", "format")
        self._rate = rate

    def _set_transcription(self, given: object, param: str) -> None:
        if given is None:
            return
        if not isinstance(given, dict):
            raise _EventError(f"{param} must be an object", "invalid_value", param)
        for key in ("model", "language", "prompt"):
            if key in given:
                self._transcription[key] = given[key]

    def _set_turn_detection(self, given: object, param: str) -> None:
        if given is not None:
            if not isinstance(given, dict) or given.get("type") != "server_vad":
                shown = json.dumps(given)[:SHOWN_CHARS]
                raise _EventError(
                    f"{param} {shown}: null or type 'server_vad' (semantic_vad is not supported)",
                    "invalid_value",
                    param,
                )
            merged = dict(self._turn_detection or {"type": "server_vad"}) | given
            try:
                VADSettings(
                    merged.get("threshold", self.settings.vad_threshold),
                    merged.get("silence_duration_ms", DEFAULT_SILENCE_MS),
                    merged.get("prefix_padding_ms", DEFAULT_PREFIX_PADDING_MS),
                )
            except (TypeError, ValueError) as error:
                raise _EventError(f"{param}: {error}", "invalid_value", param) from None
            given = merged
        if given != self._turn_detection and self._audio_started:
            raise _EventError(
                f"{param} can change only before the first audio (it decides where items end)",
                "invalid_value",
                param,
            )
        self._turn_detection = given

    def _append(self, event: dict) -> Samples:
        if self.dialect == VLLM and self._model is None:
            raise _EventError(_NOT_VALIDATED, "model_not_validated")
        audio = event.get("audio")
        try:
            data = pybase64.b64decode(audio, validate=True) if isinstance(audio, str) else None
        except (binascii.Error, ValueError):
            data = None
        if not data or len(data) % 2:
            shown = "no 'audio'" if not isinstance(audio, str) else f"{len(audio)} characters"
            raise _EventError(
                f"input_audio_buffer.append: 'audio' must be base64 of 16-bit PCM ({shown} that are not)",
                "invalid_audio" if self.dialect == VLLM else "invalid_value",
                "audio",
            )
        pcm = np.frombuffer(data, "<i2").astype(np.float32) / np.float32(INT16_FULL_SCALE)
        if self._resampler is None:
            rate = VLLM_RATE if self.dialect == VLLM else self._rate
            self._resampler = Resampler(rate, VLLM_RATE)
        self._audio_started = True
        self._uncommitted += len(pcm)
        return Samples(self._resampler.push(pcm))

    def _commit(self, event: dict) -> Reply | Commit:
        if self.dialect == VLLM:
            if self._model is None:
                raise _EventError(_NOT_VALIDATED, "model_not_validated")
            if not event.get("final"):
                return Reply(())  # vLLM's first commit starts the transcription: it runs from the first audio
        elif not self._uncommitted:
            raise _EventError(
                "Error committing input audio buffer: the buffer holds no audio",
                "input_audio_buffer_commit_empty",
            )
        heard = self._uncommitted
        self._uncommitted = 0
        tail = self._resampler.flush() if self._resampler is not None else np.zeros(0, np.float32)
        self._resampler = None
        if not heard or (self._turn_detection is not None and self.dialect == OPENAI and not self._open_item()):
            return Reply(self._empty_item())  # no audio (vLLM), or none of it speech (server VAD): no text
        return Commit(tail)

    def _open_item(self) -> bool:
        """Whether an item has been reported (its speech started) and not yet committed."""
        return any(not item.committed for item in self._items.values())

    def _empty_item(self) -> tuple[str, ...]:
        """What a commit of no speech answers: an item whose text is empty (vLLM: ``transcription.done``)."""
        if self.dialect == VLLM:
            return (json.dumps({"type": "transcription.done", "text": "", "usage": _vllm_usage(0)}),)
        item = _Item()
        previous, self._previous_item = self._previous_item, item.id
        added = "conversation.item.created" if self._beta else "conversation.item.added"
        return (
            self._event("input_audio_buffer.committed", previous_item_id=previous, item_id=item.id),
            self._event(added, previous_item_id=previous, item=_user_item(item.id, None)),
            self._event(
                "conversation.item.input_audio_transcription.completed",
                item_id=item.id,
                content_index=0,
                transcript="",
                usage={"type": "duration", "seconds": 0.0},
            ),
            self._event("conversation.item.done", previous_item_id=None, item=_user_item(item.id, "")),
        )

    def _clear(self) -> Clear:
        self._uncommitted = 0
        self._resampler = None
        return Clear((self._event("input_audio_buffer.cleared"),))

    # -- results ---------------------------------------------------------------------------------

    def _delta(self, item: _Item, text: str) -> tuple[str, ...]:
        """The text's growth since the last delta (none when the text was revised: the final one tells)."""
        if len(text) <= len(item.sent) or not text.startswith(item.sent):
            return ()
        delta, item.sent = text[len(item.sent) :], text
        if self.dialect == VLLM:
            return (json.dumps({"type": "transcription.delta", "delta": delta}),)
        return (
            self._event(
                "conversation.item.input_audio_transcription.delta", item_id=item.id, content_index=0, delta=delta
            ),
        )

    def _committed(self, item: _Item, segment: Segment) -> list[str]:
        if self.dialect == VLLM:
            return []
        messages = []
        if self._turn_detection is not None:
            end_ms = round((segment.end_s or segment.start_s) * MS_PER_S)
            messages.append(self._event("input_audio_buffer.speech_stopped", audio_end_ms=end_ms, item_id=item.id))
        previous, self._previous_item = self._previous_item, item.id
        messages.append(self._event("input_audio_buffer.committed", previous_item_id=previous, item_id=item.id))
        added = "conversation.item.created" if self._beta else "conversation.item.added"
        messages.append(self._event(added, previous_item_id=previous, item=_user_item(item.id, None)))
        return messages

    def _completed(self, item: _Item, segment: Segment) -> list[str]:
        text = segment.transcript.text
        seconds = round((segment.end_s or segment.start_s) - segment.start_s, 3)
        if self.dialect == VLLM:
            usage = _vllm_usage(len(segment.transcript.tokens))
            return [json.dumps({"type": "transcription.done", "text": text, "usage": usage})]
        return [
            self._event(
                "conversation.item.input_audio_transcription.completed",
                item_id=item.id,
                content_index=0,
                transcript=text,
                usage={"type": "duration", "seconds": seconds},
            ),
            self._event("conversation.item.done", previous_item_id=None, item=_user_item(item.id, text)),
        ]

    # -- formatting ------------------------------------------------------------------------------

    def _session(self) -> dict:
        """The session as ``session.created`` / ``.updated`` report it (the beta's fields for a beta client)."""
        if self._beta:
            return {
                "id": self._session_id,
                "object": "realtime.transcription_session",
                "input_audio_format": "pcm16",
                "input_audio_transcription": dict(self._transcription),
                "turn_detection": self._turn_detection,
                "client_secret": None,
            }
        return {
            "type": "transcription",
            "object": "realtime.transcription_session",
            "id": self._session_id,
            "audio": {
                "input": {
                    "format": {"type": "audio/pcm", "rate": self._rate},
                    "transcription": dict(self._transcription),
                    "turn_detection": self._turn_detection,
                    "noise_reduction": None,
                }
            },
            "include": None,
        }

    def _event(self, kind: str, **fields: object) -> str:
        return json.dumps({"type": kind, "event_id": _new_id("event_"), **fields})

    def _refuse(self, refusal: _EventError) -> Reply:
        return Reply((self._error_event(str(refusal), refusal.code, refusal.param),))

    def _error_event(self, message: str, code: str, param: str | None = None) -> str:
        if self.dialect == VLLM:
            return json.dumps({"type": "error", "error": message, "code": code})
        error = {
            "type": "invalid_request_error",
            "code": code,
            "message": message,
            "param": param,
            "event_id": self._event_id,
        }
        return self._event("error", error=error)


_NOT_VALIDATED = "Model not validated. Make sure to validate the model by sending a session.update event."


def _vllm_usage(tokens: int) -> dict:
    """vLLM's ``usage`` of a transcription of ``tokens`` tokens (no prompt: the server's model has none to count)."""
    return {"prompt_tokens": 0, "total_tokens": tokens, "completion_tokens": tokens, "completion_tokens_details": None}


def _user_item(item_id: str, transcript: str | None) -> dict:
    """A user's audio message item, as OpenAI's events carry it (never its audio)."""
    return {
        "id": item_id,
        "object": "realtime.item",
        "type": "message",
        "status": "completed",
        "role": "user",
        "content": [{"type": "input_audio", "transcript": transcript}],
    }


def openai_hint(query: Mapping[str, str], headers: Mapping[str, str]) -> bool:
    """Whether a handshake looks like OpenAI's SDK: ``intent`` or ``model`` in its query, or a bearer token."""
    return "intent" in query or "model" in query or headers.get("authorization", "").lower().startswith("bearer ")
