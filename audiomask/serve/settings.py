"""The options of ``audiomask serve`` as one frozen dataclass, checked when it is made.

>>> ServeSettings().host, ServeSettings().port, ServeSettings().max_connections
('127.0.0.1', 6006, 64)
>>> ServeSettings(max_connections=0)
Traceback (most recent call last):
...
ValueError: --max-connections must be >= 1, got 0
>>> ServeSettings(max_connections=4, frontend_workers=8)
Traceback (most recent call last):
...
ValueError: --frontend-workers must be at most --max-connections (4): each process owns a share of the \
connections' slots, got 8
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from audiomask.checks import check_int
from audiomask.vad.endpoints import (
    DEFAULT_PREFIX_PADDING_MS,
    DEFAULT_SILENCE_MS,
    DEFAULT_THRESHOLD,
    MS_PER_S,
    VADSettings,
)

__all__ = [
    "DEFAULT_DTYPE",
    "DEFAULT_ENDPOINT_SILENCE_S",
    "DEFAULT_HANDSHAKE_TIMEOUT_S",
    "DEFAULT_IDLE_TIMEOUT_S",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MAX_MESSAGES_PER_S",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "DEFAULT_MAX_PENDING_HANDSHAKES",
    "DEFAULT_MAX_SEGMENT_S",
    "DEFAULT_VAD_THRESHOLD",
    "Endpointing",
    "DEFAULT_PORT",
    "DTYPES",
    "LOOPBACK",
    "MAX_PORT",
    "MAX_WS_WORKERS",
    "MIN_MESSAGE_BYTES",
    "SERVE_THREADS",
    "ServeSettings",
    "check_ctc_options",
]

LOOPBACK = "127.0.0.1"  # the default address: reachable from this machine only, until told otherwise
DEFAULT_PORT = 6006  # sherpa-onnx's servers' default, so its clients' defaults find this one
MAX_PORT = 65535
# Every connection is an encoder slot (max_streams), and a chunk step computes every slot of its lane (static
# shapes): on a CPU 16 lanes of 4 slots (capacity.default_lanes), one client's chunk costing one lane's step and
# 64 clients' 16; raise it on a GPU (one lane).
DEFAULT_MAX_CONNECTIONS = 64
FLOAT32_BYTES = 4
DEFAULT_MAX_MESSAGE_BYTES = 2**20  # 1 MiB a frame: 16 s of float32 samples, sherpa-onnx's default limit
MIN_MESSAGE_BYTES = FLOAT32_BYTES  # one sample
DEFAULT_IDLE_TIMEOUT_S = 30.0  # seconds without a message before a connection is closed
# A TCP connection has this long to send a whole HTTP request head (the WebSocket upgrade request): on a
# slow mobile link a handshake takes well under a second; a connection that says nothing holds a file.
DEFAULT_HANDSHAKE_TIMEOUT_S = 10.0
# Connections accepted whose request head has not all come, per server process (beyond it the one waiting
# longest is closed): with --max-connections 64 and the server's own ~20 files, under the common limit of
# 1,024 open files (ulimit -n).
DEFAULT_MAX_PENDING_HANDSHAKES = 256
# Messages a connection may send a second, on average over a second: sherpa-onnx's and WeNet's clients send
# 10-100, the browser page 10 (100 ms frames), an AudioWorklet sending each 128-frame block ~375 at 48 kHz,
# and a client replaying a file as fast as the server takes it a few hundred of 100 ms.
DEFAULT_MAX_MESSAGES_PER_S = 1000.0
# torch intra-op threads of a server process (or Ray replica): a chunk step's small matrices gain nothing
# from more, and the front end and the event loop need the other cores (as for `audiomask transcribe`).
SERVE_THREADS = 1
# Endpoints on the sherpa-onnx route (audiomask.serve.segments), sherpa-onnx's defaults (Kaldi's rules 2 and 3).
# Voice-activity endpointing suited to conversation (OpenAI's server VAD defaults): half a second of silence
# ends an utterance.
DEFAULT_ENDPOINT_SILENCE_S = DEFAULT_SILENCE_MS / MS_PER_S  # seconds of silence after speech that end a segment
DEFAULT_VAD_THRESHOLD = DEFAULT_THRESHOLD  # speech probability at which speech starts
DEFAULT_MAX_SEGMENT_S = 20.0  # seconds a segment lasts at the most
# How a connection's audio is cut into segments: (voice-activity endpointing or None, longest segment in seconds).
Endpointing = tuple[VADSettings | None, float | None]
DTYPES = ("float32", "bfloat16", "float16")  # what --dtype takes: torch dtype names
DEFAULT_DTYPE = "float32"  # the shipped model is trained and measured in float32
MAX_WS_WORKERS = 256  # WebSocket worker processes: a bound on a typo, far above any host's cores


@dataclass(frozen=True)
class ServeSettings:
    """What ``audiomask serve`` was told: address, model, streaming settings and limits.

    Attributes:
        host: the address to bind (default the loopback, ``127.0.0.1``: ``0.0.0.0`` serves every interface).
        port: the TCP port; ``0`` picks a free one.
        model: a model file (:func:`audiomask.asr.checkpoint.save_model`); ``None``: the shipped model.
        device: ``auto`` (CUDA where available), ``cpu``, ``cuda`` or ``cuda:N``; resolved when the
            recognizer is built (so settings made on a machine without a GPU may name one).
        dtype: the model's weights and activations: ``float32`` (default), ``bfloat16`` or ``float16``
            (:data:`DTYPES`; half precision for large encoders on a GPU).
        chunk_ms: milliseconds of audio per encoder chunk; ``None``: the model's.
        left_chunks: chunks of left context; ``None``: the model's.
        max_connections: WebSocket connections served at once; each is one encoder slot of the shared
            recognizer (its ``max_streams``); one more is refused with HTTP 503 and ``Retry-After``.
        max_message_bytes: the largest WebSocket message a client may send, bytes.
        idle_timeout_s: seconds a connection may go without sending a message before it is closed
            (its stream then no longer holds the others' encoder steps).
        handshake_timeout_s: seconds a TCP connection has, from its accept (or from the last response on a
            kept-alive HTTP connection), to send a whole HTTP request head; then it is closed.
        max_pending_handshakes: connections accepted whose request head has not all come, per server
            process; one more closes the one that has waited longest (a bound on the files they hold).
        max_messages_per_s: messages a connection may send a second, on average (a token bucket holding
            one second of them); one over closes it with 1008 (each message costs the event loop that
            the other connections share).
        frontend_workers: processes that compute the streams' features (each owns a share of the
            slots, at most ``max_connections``); ``0``: a thread of the server process (an LLM
            checkpoint's: its updates' thread and front-end threads); ``None``: that on the CPU, on CUDA
            one process per four cores, since there a thread shares the interpreter lock with the
            connections and the thread that drives the GPU.
        ws_workers: processes that serve the WebSocket connections, handing their samples to the
            recognizer in the main process; ``0``: the main process serves them itself; ``None``: ``0`` on
            the CPU, one per four cores on CUDA (:func:`~audiomask.serve.workers.resolve_ws_workers`).
        max_wait_ms: how long a connection's ready chunk waits for the others' before a step runs the
            ready ones (the recognizer's ``max_wait_ms``); ``None``: one chunk on the CPU, 40 ms (or the
            chunk if shorter) on CUDA.
        endpoint_silence_s: seconds of silence after speech, by voice-activity detection (:mod:`audiomask.vad`),
            that end a segment (an endpoint: its result is final, and the next segment's text starts afresh)
            on the routes that split a stream into segments (the sherpa-onnx route; WeNet's with
            ``continuous_decoding``); ``0``: no endpoints, one segment per connection (see
            :mod:`audiomask.serve.segments`). Realtime sessions choose their own (``turn_detection``).
        vad_threshold: the speech probability, in (0, 1), at which the detector hears speech start.
        max_segment_s: seconds a segment lasts at the most, on every route.
        token: when set, a client must send ``Authorization: Bearer TOKEN`` or ``?token=TOKEN``
            (otherwise HTTP 401 at the handshake).
        certfile, keyfile: a PEM certificate and its key: serve ``wss://`` / ``https://`` (both or neither).
        context, language: for an LLM checkpoint directory as ``model``: text the recogniser is told first,
            and the language it writes (``None``: it detects); a CTC model takes neither.
        fixed_tokens: for an LLM checkpoint directory: every update decodes exactly this many tokens, the
            end token ignored (:class:`~audiomask.llm.streaming.StreamPolicy`'s ``fixed_tokens``: load tests
            of random weights, which never say it); ``None``: until the end token, as a user wants.
        replica: this server's number among the replicas of ``audiomask serve --replicas N`` (``/health``
            reports it); ``None``: the only one (:mod:`audiomask.serve.launch`).
    """

    host: str = LOOPBACK
    port: int = DEFAULT_PORT
    model: str | None = None
    device: str = "auto"
    dtype: str = DEFAULT_DTYPE
    chunk_ms: int | None = None
    left_chunks: int | None = None
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    handshake_timeout_s: float = DEFAULT_HANDSHAKE_TIMEOUT_S
    max_pending_handshakes: int = DEFAULT_MAX_PENDING_HANDSHAKES
    max_messages_per_s: float = DEFAULT_MAX_MESSAGES_PER_S
    frontend_workers: int | None = None
    ws_workers: int | None = None
    max_wait_ms: int | None = None
    endpoint_silence_s: float = DEFAULT_ENDPOINT_SILENCE_S
    vad_threshold: float = DEFAULT_VAD_THRESHOLD
    max_segment_s: float = DEFAULT_MAX_SEGMENT_S
    token: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    context: str = ""
    language: str | None = None
    fixed_tokens: int | None = None
    replica: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host:
            raise ValueError(f"--host must be an address such as {LOOPBACK}, got {self.host!r}")
        check_int("--port", self.port, minimum=0, maximum=MAX_PORT)
        if self.dtype not in DTYPES:
            raise ValueError(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.chunk_ms is not None:
            check_int("--chunk-ms", self.chunk_ms, minimum=1)
        if self.left_chunks is not None:
            check_int("--left-chunks", self.left_chunks, minimum=0)
        check_int("--max-connections", self.max_connections, minimum=1)
        check_int("--max-message-bytes", self.max_message_bytes, minimum=MIN_MESSAGE_BYTES)
        _check_seconds("--idle-timeout-s", self.idle_timeout_s, zero=False)
        _check_seconds("--handshake-timeout-s", self.handshake_timeout_s, zero=False)
        check_int("--max-pending-handshakes", self.max_pending_handshakes, minimum=1)
        _check_seconds("--max-messages-per-s", self.max_messages_per_s, zero=False, unit="")
        if self.max_wait_ms is not None:
            check_int("--max-wait-ms", self.max_wait_ms, minimum=0)
        if self.frontend_workers is not None:
            check_int("--frontend-workers", self.frontend_workers, minimum=0)
            if self.frontend_workers > self.max_connections:
                raise ValueError(
                    f"--frontend-workers must be at most --max-connections ({self.max_connections}): each "
                    f"process owns a share of the connections' slots, got {self.frontend_workers}"
                )
        _check_seconds("--endpoint-silence-s", self.endpoint_silence_s, zero=True)
        _check_seconds("--max-segment-s", self.max_segment_s, zero=False)
        try:
            VADSettings(threshold=self.vad_threshold)
        except (TypeError, ValueError) as error:
            raise ValueError(f"--vad-threshold: {error}") from None
        if self.ws_workers is not None:
            check_int("--ws-workers", self.ws_workers, minimum=0, maximum=MAX_WS_WORKERS)
        if self.token is not None and (
            not isinstance(self.token, str) or not self.token or self.token != self.token.strip()
        ):
            raise ValueError("--token must be a non-empty string without surrounding whitespace")
        if not isinstance(self.context, str) or not (self.language is None or isinstance(self.language, str)):
            raise ValueError(f"--context and --language must be text, got {self.context!r}, {self.language!r}")
        if self.fixed_tokens is not None:
            check_int("--fixed-tokens", self.fixed_tokens, minimum=1)
        if self.replica is not None:
            check_int("replica", self.replica, minimum=0)
        if (self.certfile is None) != (self.keyfile is None):
            raise ValueError(
                f"--certfile and --keyfile go together (wss needs both), got certfile={self.certfile!r}, "
                f"keyfile={self.keyfile!r}"
            )

    @property
    def endpointing(self) -> Endpointing:
        """``(vad, max_segment_s)`` of the routes that split a stream into segments at endpoints (``vad`` is
        ``None`` when ``endpoint_silence_s`` is 0)."""
        return self.segments_by(self.endpoint_silence_s)

    def segments_by(self, silence_s: float | None, prefix_padding_ms: int = DEFAULT_PREFIX_PADDING_MS) -> Endpointing:
        """``(vad, max_segment_s)``: voice-activity endpoints after ``silence_s`` of silence (``None`` or 0:
        none) at this server's threshold, and its longest segment."""
        if not silence_s:
            return None, float(self.max_segment_s)
        vad = VADSettings(self.vad_threshold, round(silence_s * MS_PER_S), prefix_padding_ms)
        return vad, float(self.max_segment_s)

    @property
    def secure(self) -> bool:
        """Whether connections are TLS (``wss://``, ``https://``)."""
        return self.certfile is not None

    def describe_routes(self) -> str:
        """The WebSocket routes' URLs and what their messages hold, for a start-up line.

        >>> ServeSettings(port=8000).describe_routes()
        'ws://127.0.0.1:8000/ (sherpa-onnx, float32 samples), ws://127.0.0.1:8000/wenet (WeNet, int16 PCM), \
ws://127.0.0.1:8000/v1/realtime (OpenAI Realtime and vLLM, base64 PCM16)'
        """
        address = f"{'wss' if self.secure else 'ws'}://{self.host}:{self.port}"
        return (
            f"{address}/ (sherpa-onnx, float32 samples), {address}/wenet (WeNet, int16 PCM), "
            f"{address}/v1/realtime (OpenAI Realtime and vLLM, base64 PCM16)"
        )


def check_ctc_options(settings: ServeSettings) -> None:
    """``ValueError`` naming the LLM-only options (``--context``, ``--language``, ``--fixed-tokens``) that
    ``settings`` gives, for a model that is not an LLM checkpoint directory."""
    given = [
        name
        for name, value in (
            ("--context", settings.context or None),
            ("--language", settings.language),
            ("--fixed-tokens", settings.fixed_tokens),
        )
        if value is not None
    ]
    if given:
        raise ValueError(f"{', '.join(given)}: need an LLM checkpoint directory as --model (Qwen3-ASR)")


def _check_seconds(name: str, value: object, *, zero: bool, unit: str = " of seconds") -> None:
    """``ValueError`` naming the option unless ``value`` is a finite number (of ``unit``), > 0 (or ``0`` if
    ``zero``)."""
    number = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    if not number or value < 0 or (value == 0 and not zero):
        kind = f"a number{unit} >= 0" if zero else f"a positive number{unit}"
        raise ValueError(f"{name} must be {kind}, got {value!r}")
