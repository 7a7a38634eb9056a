"""The model file: an :class:`~audiomask.asr.model.ASRModel` in one safetensors file, with its config and card.

Layout of the file (format :data:`FORMAT`):

- tensors ``encoder.<name>`` (the :class:`~audiomask.models.Phi4MMEncoder`
  state dict) and ``head.<name>`` (the :class:`~audiomask.models.ctc.CTCHead`'s),
  floating tensors stored in the ``dtype`` given to :func:`save_model`;
- string metadata: ``format``; ``encoder_config`` (JSON of the
  :class:`~audiomask.models.Phi4MMAudioConfig` fields); ``alphabet`` (the
  :class:`~audiomask.asr.decoding.CharTokenizer`'s characters, in id order);
  ``chunk_ms`` and ``left_chunks``, the streaming defaults (written when the
  model has any: given to :func:`save_model` or from the encoder config); and
  ``card``, free-form JSON (training data, error-rate tables, ...).

:func:`load_model` with no path loads the model shipped inside the package
(:data:`DEFAULT_MODEL_PATH`, of the architecture :data:`SHIPPED_ENCODER_CONFIG`);
:func:`model_info` reads a file's metadata and tensor shapes without loading its weights.
The format holds Phi-4MM encoders.

>>> import tempfile
>>> from audiomask.asr.decoding import CharTokenizer
>>> from audiomask.asr.model import ASRModel
>>> model = ASRModel(Phi4MMEncoder(SHIPPED_ENCODER_CONFIG), CTCHead(192, 4), CharTokenizer("ab "))
>>> path = tempfile.mkdtemp() + "/random.safetensors"
>>> save_model(model, path, chunk_ms=640, left_chunks=2, card={"data": "none: random weights"})
>>> info = model_info(path)
>>> info["chunk_ms"], info["left_chunks"], info["alphabet"], info["parameters"] > 0
(640, 2, 'ab ', True)
>>> loaded = load_model(path)
>>> loaded.encoder.config.chunk_size, loaded.tokenizer.alphabet   # 640 ms = 16 tokens of 40 ms
(16, 'ab ')
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import stat
from collections.abc import Mapping
from importlib.resources import files
from pathlib import Path
from typing import Any

import torch

from audiomask.asr.capacity import MAX_CHUNK_MS, MAX_CONTEXT_MS
from audiomask.asr.decoding import CharTokenizer
from audiomask.asr.model import ASRModel
from audiomask.checks import check_int
from audiomask.constants import FRAME_MS
from audiomask.models import Phi4MMAudioConfig, Phi4MMEncoder
from audiomask.models.ctc import CTCHead
from audiomask.models.pretrained import encoder_shapes, shape_mismatch

__all__ = ["DEFAULT_MODEL_PATH", "FORMAT", "SHIPPED_ENCODER_CONFIG", "load_model", "model_info", "save_model"]

FORMAT = "audiomask-ctc/1"  # the metadata "format" of the files this module writes and reads
DEFAULT_MODEL_PATH = Path(str(files("audiomask") / "assets" / "ctc-small.safetensors"))
# The shipped model's encoder: a small streaming Phi-4MM Conformer (the released one is 1024 wide,
# 24 blocks, 8 frames a token), with its streaming defaults: 4 frames (40 ms) per token, chunks of
# 8 tokens (320 ms), 8 chunks (2.56 s) of left context. Its causal conv sees 8 past tokens (320 ms),
# its relative-position bias is clipped at 128 tokens (5.12 s).
SHIPPED_ENCODER_CONFIG = Phi4MMAudioConfig(
    hidden_size=192,
    intermediate_size=512,
    num_blocks=6,
    num_attention_heads=4,
    ext_pw_out_channel=192,
    depthwise_separable_out_channel=192,
    kernel_size=9,
    nemo_conv_channels=64,
    time_reduction=4,
    bias_max_distance=128,
    chunk_size=8,
    left_chunk=8,
)
STORAGE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # what floating weights may be stored as

_ENCODER_PREFIX = "encoder."
_HEAD_PREFIX = "head."
_REQUIRED_METADATA = ("format", "encoder_config", "alphabet")
# What a path that is no regular file is, by its st_mode: named, never opened (a FIFO would block).
_FILE_KINDS = (
    (stat.S_ISDIR, "is a directory, not a model file"),
    (stat.S_ISCHR, "not a regular file (a character device)"),
    (stat.S_ISBLK, "not a regular file (a block device)"),
    (stat.S_ISFIFO, "not a regular file (a named pipe)"),
    (stat.S_ISSOCK, "not a regular file (a socket)"),
)


def _token_ms(config: Phi4MMAudioConfig) -> int:
    """Milliseconds of audio per encoder token."""
    return FRAME_MS * config.time_reduction


def _check_dtype(name: str, dtype: object) -> torch.dtype:
    if dtype not in STORAGE_DTYPES:
        raise ValueError(f"{name} must be one of {[str(d) for d in STORAGE_DTYPES]}, got {dtype!r}")
    return dtype  # type: ignore[return-value]


def _streaming_defaults(config: Phi4MMAudioConfig, chunk_ms: int | None, left_chunks: int | None) -> dict[str, int]:
    """The ``chunk_ms`` / ``left_chunks`` metadata: those given, else the config's (none for full attention).

    Within what a recognizer accepts: a chunk of at most ``MAX_CHUNK_MS``, a
    context of at most ``MAX_CONTEXT_MS`` (:mod:`audiomask.asr.capacity`).
    """
    unit = _token_ms(config)
    if chunk_ms is None:
        chunk_ms = config.chunk_size * unit if config.chunk_size >= 1 else None
    if chunk_ms is not None and check_int("chunk_ms", chunk_ms, minimum=1, maximum=MAX_CHUNK_MS) % unit:
        raise ValueError(f"chunk_ms must be a multiple of {unit} (one encoder token), got {chunk_ms}")
    left_chunks = config.left_chunk if left_chunks is None else check_int("left_chunks", left_chunks, minimum=0)
    if chunk_ms is not None and (left_chunks + 1) * chunk_ms > MAX_CONTEXT_MS:
        raise ValueError(
            f"left_chunks {left_chunks} with chunk_ms {chunk_ms}: a stream attends to (left_chunks + 1) * chunk_ms "
            f"= {(left_chunks + 1) * chunk_ms} ms of audio, which exceeds MAX_CONTEXT_MS = {MAX_CONTEXT_MS}"
        )
    return {"left_chunks": left_chunks} | ({} if chunk_ms is None else {"chunk_ms": chunk_ms})


def save_model(
    model: ASRModel,
    path: str | os.PathLike,
    *,
    dtype: torch.dtype = torch.float32,
    chunk_ms: int | None = None,
    left_chunks: int | None = None,
    card: Mapping[str, object] | None = None,
) -> None:
    """Write ``model`` to the safetensors file ``path`` (see the module docstring for the layout).

    Args:
        model: the encoder, CTC head and tokenizer to save (any device; written from host copies).
        path: the file to write (replaced if it exists).
        dtype: storage of the floating tensors: ``torch.float32`` (default), ``float16`` or ``bfloat16``.
        chunk_ms: default milliseconds per streaming chunk, a multiple of one token
            (``10 * time_reduction`` ms); default: the encoder config's ``chunk_size``.
        left_chunks: default chunks of left context; default: the encoder config's ``left_chunk``.
        card: the model card, any JSON-serialisable mapping (data, sizes, CER/WER tables...).
    """
    if not isinstance(model, ASRModel):
        raise ValueError(f"model must be an ASRModel, got {type(model).__name__}")
    if not isinstance(model.encoder, Phi4MMEncoder):
        raise ValueError(f"model.encoder must be a Phi4MMEncoder (the format's), got {type(model.encoder).__name__}")
    dtype = _check_dtype("dtype", dtype)
    if card is not None and not isinstance(card, Mapping):
        raise ValueError(f"card must be a mapping (JSON object), got {type(card).__name__}")
    try:
        card_json = json.dumps(dict(card or {}), ensure_ascii=False)
    except (TypeError, ValueError) as error:
        raise ValueError(f"card must be JSON-serialisable: {error}") from None
    config = model.encoder.config
    metadata = {
        "format": FORMAT,
        "encoder_config": json.dumps(dataclasses.asdict(config)),
        "alphabet": model.tokenizer.alphabet,
        "card": card_json,
    } | {key: str(value) for key, value in _streaming_defaults(config, chunk_ms, left_chunks).items()}
    tensors = {}
    for prefix, module in ((_ENCODER_PREFIX, model.encoder), (_HEAD_PREFIX, model.head)):
        for name, tensor in module.state_dict().items():
            tensor = tensor.detach().to("cpu")  # device -> host: a blocking copy, read at once
            tensors[prefix + name] = (tensor.to(dtype) if tensor.is_floating_point() else tensor).contiguous()
    from safetensors.torch import save_file

    save_file(tensors, os.fspath(path), metadata=metadata)


def _resolve(path: str | os.PathLike | None) -> Path:
    """``path`` as a :class:`Path` (``None``: the shipped model); anything but a regular file is a ``ValueError``."""
    resolved = DEFAULT_MODEL_PATH if path is None else Path(path)
    try:
        mode = os.stat(resolved).st_mode
    except OSError as error:
        if path is None:
            raise ValueError(
                f"the shipped model {str(resolved)!r} is missing from this install (pass a model file: load_model(path), audiomask ... --model PATH)"
            ) from None
        missing = isinstance(error, (FileNotFoundError, NotADirectoryError))
        reason = "no such file" if missing else f"cannot be read ({error.strerror})"
        raise ValueError(f"model {str(resolved)!r}: {reason}") from None
    reason = next((reason for is_kind, reason in _FILE_KINDS if is_kind(mode)), None)
    if reason:
        raise ValueError(f"model {str(resolved)!r}: {reason}")
    return resolved


@dataclasses.dataclass(frozen=True)
class _Header:
    """A model file's checked metadata and tensor shapes (no weights read)."""

    path: Path
    metadata: dict[str, str]
    shapes: dict[str, list[int]]
    dtypes: list[str]
    config: Phi4MMAudioConfig
    tokenizer: CharTokenizer
    card: Any


def _read_header(path: str | os.PathLike | None) -> _Header:
    """The header of the model file ``path`` (``None``: the shipped one), checked: ``ValueError`` naming it."""
    resolved = _resolve(path)
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(resolved), framework="pt") as reader:
            metadata = reader.metadata() or {}
            slices = {name: reader.get_slice(name) for name in reader.keys()}  # noqa: SIM118
            shapes = {name: piece.get_shape() for name, piece in slices.items()}
            dtypes = sorted({piece.get_dtype() for piece in slices.values()})
    except (SafetensorError, OSError) as error:
        raise ValueError(f"model {str(resolved)!r}: not a readable safetensors file ({error})") from None
    if metadata.get("format") != FORMAT:
        raise ValueError(
            f"model {str(resolved)!r}: not an audiomask model file (metadata format is {metadata.get('format')!r}, "
            f"expected {FORMAT!r})"
        )
    missing = [key for key in _REQUIRED_METADATA if key not in metadata]
    if missing:
        raise ValueError(f"model {str(resolved)!r}: metadata lacks {missing}")
    try:
        tokenizer = CharTokenizer(metadata["alphabet"])
    except ValueError as error:
        raise ValueError(f"model {str(resolved)!r}: bad alphabet: {error}") from None
    config = _config(resolved, metadata)
    card = _json_field(resolved, metadata, "card")
    if not isinstance(card, dict):
        raise ValueError(f"model {str(resolved)!r}: metadata 'card' must be a JSON object, got {type(card).__name__}")
    _check_shapes(resolved, config, tokenizer, shapes)
    return _Header(resolved, metadata, shapes, dtypes, config, tokenizer, card)


def _check_shapes(
    path: Path, config: Phi4MMAudioConfig, tokenizer: CharTokenizer, shapes: dict[str, list[int]]
) -> None:
    """Refuse stray tensors, a config beyond the bounds of ``encoder_shapes`` and tensors that do not fit it."""
    stray = sorted(name for name in shapes if not name.startswith((_ENCODER_PREFIX, _HEAD_PREFIX)))
    if stray:
        raise ValueError(f"model {str(path)!r}: tensors outside encoder./head.: {stray[:4]}")
    try:
        encoder = encoder_shapes(config)
    except ValueError as error:
        raise ValueError(f"model {str(path)!r}: {error}") from None
    with torch.device("meta"):
        head = CTCHead(config.hidden_size, tokenizer.vocab_size).state_dict()
    expected = {_ENCODER_PREFIX + name: shape for name, shape in encoder.items()}
    expected |= {_HEAD_PREFIX + name: tuple(tensor.shape) for name, tensor in head.items()}
    mismatch = shape_mismatch(expected, shapes)
    if mismatch:
        raise ValueError(f"model {str(path)!r}: the weights do not fit the stored config: {mismatch}")


def _json_field(path: Path, metadata: Mapping[str, str], key: str) -> Any:
    try:
        return json.loads(metadata.get(key, "{}"))
    except json.JSONDecodeError as error:
        raise ValueError(f"model {str(path)!r}: metadata {key!r} is not valid JSON ({error})") from None


def _int_field(path: Path, metadata: Mapping[str, str], key: str) -> int | None:
    if key not in metadata:
        return None
    try:
        return check_int(key, int(metadata[key]), minimum=0)
    except ValueError:
        raise ValueError(f"model {str(path)!r}: metadata {key!r} must be an integer, got {metadata[key]!r}") from None


def _config(path: Path, metadata: Mapping[str, str]) -> Phi4MMAudioConfig:
    """The encoder config of the file, with its streaming defaults in ``chunk_size`` / ``left_chunk``."""
    values = _json_field(path, metadata, "encoder_config")
    fields = {field.name for field in dataclasses.fields(Phi4MMAudioConfig)}
    if not isinstance(values, dict) or set(values) - fields:
        unknown = sorted(set(values) - fields) if isinstance(values, dict) else type(values).__name__
        raise ValueError(f"model {str(path)!r}: encoder_config has fields Phi4MMAudioConfig lacks: {unknown}")
    try:
        config = Phi4MMAudioConfig(**values)
        chunk_ms, left_chunks = _int_field(path, metadata, "chunk_ms"), _int_field(path, metadata, "left_chunks")
        defaults = _streaming_defaults(config, chunk_ms, left_chunks)
        chunk_size = defaults["chunk_ms"] // _token_ms(config) if "chunk_ms" in defaults else config.chunk_size
        config = dataclasses.replace(config, chunk_size=chunk_size, left_chunk=defaults["left_chunks"])
    except (TypeError, ValueError) as error:
        raise ValueError(f"model {str(path)!r}: bad encoder_config or streaming defaults: {error}") from None
    return config


def model_info(path: str | os.PathLike | None = None) -> dict[str, Any]:
    """What a model file holds, read without loading its weights (``None``: the shipped model).

    Returns a dict: ``path`` (str), ``format``, ``encoder_config`` (dict of the
    config fields, ``chunk_size`` / ``left_chunk`` set to the streaming defaults), ``alphabet``, ``vocab_size`` (characters + blank),
    ``chunk_ms`` / ``left_chunks`` (the streaming defaults; ``chunk_ms`` is
    ``None`` for a full-attention model without one), ``parameters`` (number of
    stored elements, buffers included), ``dtypes`` (sorted storage dtype names),
    ``size_bytes`` (of the file) and ``card`` (dict). A missing, unreadable or
    foreign file, or one that is no regular file (a device, a named pipe: never
    opened), is a ``ValueError`` naming the path; so is a config beyond the
    bounds of :func:`~audiomask.models.pretrained.encoder_shapes` or streaming
    defaults beyond the recognizer's (``MAX_CHUNK_MS``, ``MAX_CONTEXT_MS``),
    and tensors whose names or shapes do not fit the config, all told from
    the header, before anything is allocated.
    """
    header = _read_header(path)
    config = header.config
    return {
        "path": str(header.path),
        "format": FORMAT,
        "encoder_config": dataclasses.asdict(config),
        "alphabet": header.tokenizer.alphabet,
        "vocab_size": header.tokenizer.vocab_size,
        "chunk_ms": config.chunk_size * _token_ms(config) if config.chunk_size >= 1 else None,
        "left_chunks": config.left_chunk,
        "parameters": sum(math.prod(shape) for shape in header.shapes.values()),
        "dtypes": header.dtypes,
        "size_bytes": header.path.stat().st_size,
        "card": header.card,
    }


def load_model(path: str | os.PathLike | None = None, *, dtype: torch.dtype = torch.float32) -> ASRModel:
    """The :class:`ASRModel` saved in ``path`` (``None``: the shipped model), on the CPU in ``dtype``, eval mode.

    The encoder config's ``chunk_size`` / ``left_chunk`` are the file's
    streaming defaults, so ``StreamingRecognizer(load_model())`` streams with
    them. Raises ``ValueError`` naming the path for a missing, unreadable or
    foreign file and for weights that do not fit the stored config, as
    :func:`model_info` checks them: before any weight is read.
    """
    dtype = _check_dtype("dtype", dtype)
    header = _read_header(path)
    resolved, config, tokenizer = header.path, header.config, header.tokenizer
    from safetensors.torch import load_file

    tensors = load_file(str(resolved))
    parts = {
        prefix: {name[len(prefix) :]: tensor for name, tensor in tensors.items() if name.startswith(prefix)}
        for prefix in (_ENCODER_PREFIX, _HEAD_PREFIX)
    }
    encoder = Phi4MMEncoder(config)
    head = CTCHead(config.hidden_size, tokenizer.vocab_size)
    encoder.load_state_dict(parts[_ENCODER_PREFIX])  # the shapes were checked with the header
    head.load_state_dict(parts[_HEAD_PREFIX])
    return ASRModel(encoder.to(dtype).eval(), head.to(dtype).eval(), tokenizer)
