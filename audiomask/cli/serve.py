"""``audiomask serve``: the streaming ASR server (:mod:`audiomask.serve`) on uvicorn, or on Ray Serve with ``--ray``.

The options are checked and the TLS files read, then the address is bound,
before the model loads and the server starts, so that a bad argument or an
address it cannot listen on is one line on stderr and exit status 2.
The server then runs until SIGTERM or Ctrl-C, which finish the streams in
flight (each client gets its final result) and exit 0.
"""

from __future__ import annotations

import argparse
import importlib
import ssl
import sys

from audiomask.checks import pick_device
from audiomask.cli.common import EXIT_USAGE
from audiomask.serve.settings import (
    DEFAULT_DTYPE,
    DEFAULT_ENDPOINT_SILENCE_S,
    DEFAULT_HANDSHAKE_TIMEOUT_S,
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_MAX_MESSAGES_PER_S,
    DEFAULT_MAX_PENDING_HANDSHAKES,
    DEFAULT_MAX_SEGMENT_S,
    DEFAULT_PORT,
    DEFAULT_VAD_THRESHOLD,
    DTYPES,
    LOOPBACK,
    ServeSettings,
    check_ctc_options,
)

__all__ = ["add_parser", "serve"]

RAY_MODULE = "audiomask.serve.ray_serve"
# An LLM checkpoint's connections on the CPU by default: each is a cache slot allocated at start (a 0.6B
# Qwen3-ASR's is ~0.3 GB in float32), and a CPU decodes few streams in real time.
DEFAULT_LLM_CONNECTIONS_CPU = 4


def add_parser(commands: argparse._SubParsersAction, device_help: str, model_help: str) -> None:
    """Register ``serve`` and its options on the CLI's sub-command parsers."""
    parser = commands.add_parser(
        "serve",
        help="the streaming ASR server: sherpa-onnx's WebSocket protocol at /, WeNet's at /wenet",
        description="Serve streaming recognition over WebSockets: sherpa-onnx's online protocol at / "
        "(binary little-endian FLOAT32 samples at 16 kHz, then the text 'Done'), WeNet's at /wenet (int16 "
        "PCM), GET /health, and a browser page at GET /. SIGTERM or Ctrl-C finish the streams in flight.",
    )
    parser.add_argument("--host", default=LOOPBACK, help=f"address to bind (default {LOOPBACK}: this machine only)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"TCP port (default {DEFAULT_PORT})")
    parser.add_argument("--model", help=model_help)
    parser.add_argument(
        "--context", default="", help="an LLM checkpoint's context: text it is told first (names, terms to prefer)"
    )
    parser.add_argument(
        "--language", help="the language an LLM checkpoint writes (a name or ISO code; default: it detects)"
    )
    parser.add_argument(
        "--fixed-tokens",
        type=int,
        help="an LLM checkpoint decodes exactly N tokens every update, its end token ignored: a load test of "
        "random weights, which never say it (default: until the end token)",
    )
    parser.add_argument("--device", default="auto", help=device_help)
    parser.add_argument(
        "--dtype",
        choices=DTYPES,
        default=DEFAULT_DTYPE,
        help=f"a CTC model's precision (default {DEFAULT_DTYPE}; bfloat16 for large encoders on a GPU); an LLM "
        "checkpoint runs in bfloat16 on CUDA, float32 on the CPU",
    )
    parser.add_argument(
        "--chunk-ms", type=int, help="audio per encoder chunk (default: the model's; an LLM checkpoint's: 2000)"
    )
    parser.add_argument("--left-chunks", type=int, help="chunks of left context (default: the model's)")
    parser.add_argument(
        "--max-connections",
        type=int,
        help="connections served at once, one encoder slot each (an LLM checkpoint: a cache slot each, and a "
        "quarter more for finals); more get HTTP 503 (default "
        f"{DEFAULT_MAX_CONNECTIONS}; an LLM checkpoint's: {DEFAULT_LLM_CONNECTIONS_CPU} on the CPU)",
    )
    parser.add_argument(
        "--max-message-bytes",
        type=int,
        default=DEFAULT_MAX_MESSAGE_BYTES,
        help=f"largest WebSocket message a client may send (default {DEFAULT_MAX_MESSAGE_BYTES})",
    )
    parser.add_argument(
        "--idle-timeout-s",
        type=float,
        default=DEFAULT_IDLE_TIMEOUT_S,
        help=f"close a connection that sends nothing for this long (default {DEFAULT_IDLE_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--handshake-timeout-s",
        type=float,
        default=DEFAULT_HANDSHAKE_TIMEOUT_S,
        metavar="S",
        help="close a TCP connection that has not sent a whole HTTP request (the WebSocket upgrade) this long "
        f"after it was accepted (default {DEFAULT_HANDSHAKE_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--max-pending-handshakes",
        type=int,
        default=DEFAULT_MAX_PENDING_HANDSHAKES,
        metavar="N",
        help="connections whose HTTP request has not all come, per server process; one more closes the one "
        f"that has waited longest (default {DEFAULT_MAX_PENDING_HANDSHAKES})",
    )
    parser.add_argument(
        "--max-messages-per-s",
        type=float,
        default=DEFAULT_MAX_MESSAGES_PER_S,
        metavar="N",
        help="messages a connection may send a second on average; more close it with 1008 "
        f"(default {DEFAULT_MAX_MESSAGES_PER_S:g})",
    )
    parser.add_argument(
        "--frontend-workers",
        type=int,
        metavar="N",
        help="compute the features in N processes of their own (0: a thread of the server; default: a thread "
        "on the CPU, one process per four cores on CUDA)",
    )
    parser.add_argument(
        "--ws-workers",
        type=int,
        metavar="N",
        help="serve the WebSocket connections in N processes that hand their audio to the recognizer in this "
        "one (0: this process serves them; default: 0 on the CPU, one per four cores on CUDA)",
    )
    parser.add_argument(
        "--max-wait-ms",
        type=int,
        metavar="MS",
        help="how long a ready chunk waits for the other connections' before a step runs without them "
        "(default: one chunk on the CPU, 40 ms or the chunk if shorter on CUDA; less: lower latency for clients "
        "out of step, more steps)",
    )
    parser.add_argument(
        "--endpoint-silence-s",
        type=float,
        default=DEFAULT_ENDPOINT_SILENCE_S,
        metavar="S",
        help="silence after speech, by voice-activity detection, that ends a segment (its result final, the next "
        "one's text afresh) on the sherpa-onnx route and WeNet's with continuous_decoding; 0: one segment per "
        f"connection (default {DEFAULT_ENDPOINT_SILENCE_S:g})",
    )
    parser.add_argument(
        "--vad-threshold",
        type=float,
        default=DEFAULT_VAD_THRESHOLD,
        metavar="P",
        help=f"speech probability at which the voice-activity detector hears speech (default {DEFAULT_VAD_THRESHOLD:g})",
    )
    parser.add_argument(
        "--max-segment-s",
        type=float,
        default=DEFAULT_MAX_SEGMENT_S,
        metavar="S",
        help=f"the longest segment, on every route (default {DEFAULT_MAX_SEGMENT_S:g})",
    )
    parser.add_argument("--token", help="require 'Authorization: Bearer TOKEN' or '?token=TOKEN' (else HTTP 401)")
    parser.add_argument("--certfile", help="PEM certificate: serve wss:// and https:// (with --keyfile)")
    parser.add_argument("--keyfile", help="PEM private key of --certfile")
    parser.add_argument("--ray", action="store_true", help="deploy on Ray Serve (pip install -e '.[ray]')")
    parser.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="server processes, one recognizer each, on one port (CUDA: spread over the GPUs; several on one GPU "
        "serve more streams than one process can feed); with --ray: Ray Serve replicas (default 1)",
    )
    parser.add_argument("--gpus-per-replica", type=float, default=0.0, help="with --ray: GPUs per replica")
    parser.set_defaults(run=serve)


def _check_tls(certfile: str | None, keyfile: str | None) -> None:
    """Read the certificate and key as the server will, so that a bad pair is a usage error now."""
    if certfile is None:
        return
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(certfile, keyfile)
    except (OSError, ssl.SSLError) as error:
        raise ValueError(f"--certfile {certfile} / --keyfile {keyfile}: cannot be used for TLS ({error})") from None


def _check_model_options(args: argparse.Namespace) -> bool:
    """Whether ``--model`` is an LLM checkpoint directory; ``ValueError`` for a CTC model's option with an LLM (the
    LLM's options without one: :func:`~audiomask.serve.settings.check_ctc_options`)."""
    from audiomask.llm.checkpoint import is_llm_checkpoint

    if args.model is None or not is_llm_checkpoint(args.model):
        return False
    misused = [
        name
        for name, given in (
            ("--left-chunks", args.left_chunks is not None),
            ("--dtype", args.dtype != DEFAULT_DTYPE),
        )
        if given
    ]
    if misused:
        raise ValueError(
            f"{', '.join(misused)}: for CTC models; {args.model!r} is an LLM checkpoint (it runs in bfloat16 on "
            "CUDA, float32 on the CPU)"
        )
    return True


def _max_connections(args: argparse.Namespace, llm: bool) -> int:
    """``--max-connections``, or its default: an LLM checkpoint's cache holds every slot from the start, so fewer
    on the CPU."""
    if args.max_connections is not None:
        return args.max_connections
    if llm and pick_device(args.device, "--device") == "cpu":
        return DEFAULT_LLM_CONNECTIONS_CPU
    return DEFAULT_MAX_CONNECTIONS


def serve(args: argparse.Namespace) -> int:
    """Run ``audiomask serve``; the exit status (0 after a stop signal, 2 for a bad argument)."""
    llm = _check_model_options(args)
    settings = ServeSettings(
        host=args.host,
        port=args.port,
        model=args.model,
        device=args.device,
        dtype=args.dtype,
        chunk_ms=args.chunk_ms,
        left_chunks=args.left_chunks,
        max_connections=_max_connections(args, llm),
        max_message_bytes=args.max_message_bytes,
        idle_timeout_s=args.idle_timeout_s,
        handshake_timeout_s=args.handshake_timeout_s,
        max_pending_handshakes=args.max_pending_handshakes,
        max_messages_per_s=args.max_messages_per_s,
        frontend_workers=args.frontend_workers,
        ws_workers=args.ws_workers,
        max_wait_ms=args.max_wait_ms,
        endpoint_silence_s=args.endpoint_silence_s,
        vad_threshold=args.vad_threshold,
        max_segment_s=args.max_segment_s,
        token=args.token,
        certfile=args.certfile,
        keyfile=args.keyfile,
        context=args.context,
        language=args.language,
        fixed_tokens=args.fixed_tokens,
    )
    if not llm:
        check_ctc_options(settings)
    _check_tls(settings.certfile, settings.keyfile)
    if args.ray:
        if settings.ws_workers:
            raise ValueError("--ws-workers goes without --ray: each Ray replica serves its own connections")
        return _serve_on_ray(settings, args.replicas, args.gpus_per_replica)
    if args.gpus_per_replica:
        raise ValueError("--gpus-per-replica goes with --ray (without it, --replicas spreads over the GPUs)")
    return _serve_here(settings, args.replicas)


def _serve_on_ray(settings: ServeSettings, replicas: int, gpus_per_replica: float) -> int:
    try:
        ray_serve = importlib.import_module(RAY_MODULE)
    except ImportError as error:
        print(f"audiomask: error: --ray needs Ray Serve and {RAY_MODULE} ({error})", file=sys.stderr)
        return EXIT_USAGE
    return ray_serve.run(settings, replicas=replicas, gpus_per_replica=gpus_per_replica)


def _serve_here(settings: ServeSettings, replicas: int) -> int:
    try:
        from audiomask.serve import launch
    except ImportError as error:  # fastapi, uvicorn: the optional extra
        raise ValueError(f"audiomask serve needs the serve extra: pip install 'audiomask[serve]' ({error})") from None
    if replicas == 1:
        return launch.serve(settings)
    return launch.serve_replicas(settings, replicas)
