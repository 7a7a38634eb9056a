"""Hostile arguments to every mask builder: a correct result or a ValueError naming an argument, never more.

Each property calls a builder with arguments drawn from small valid values,
huge and negative integers (beyond int64 too), floats, bools, ``None``,
strings, numpy scalars and arrays of every dtype and rank, inside an address
space only ``HEADROOM_BYTES`` larger than the process's, so an unbounded
allocation fails the test (as ``MemoryError``) instead of exhausting the
machine. Accepted calls are compared with the plain-loop references of
``mask_reference``. ``scripts/fuzz_inputs.py`` runs the same properties for
many more examples.
"""

from __future__ import annotations

import contextlib
import resource
import sys
from collections.abc import Callable, Iterator

import mask_reference as ref
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from audiomask.masks import chunk, phi4mm, qwen3_asr, set_max_mask_bytes

# Address space allowed above the process's own while a property runs: far more than any accepted
# call needs under FUZZ_MASK_BYTES (results plus a few temporaries), far less than a refused one asks.
HEADROOM_BYTES = 512 * 2**20
FUZZ_MASK_BYTES = 4 * 2**20  # the mask bound while fuzzing: accepted results stay cheap to check
# Accepted calls are compared with the plain-loop references when the result has at most
# REFERENCE_CELLS cells and no argument exceeds REFERENCE_VALUE (the references loop over values).
REFERENCE_CELLS = 4096
REFERENCE_VALUE = 10**4
EXTREMES = [2**31 - 1, 2**31, 2**32, 2**53 + 1, 2**62, 2**63 - 1, 2**63, 2**64, 2**100]


@contextlib.contextmanager
def bounded_address_space(headroom: int = HEADROOM_BYTES) -> Iterator[None]:
    """Let the process map at most ``headroom`` more bytes (RLIMIT_AS) while the block runs (Linux)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("RLIMIT_AS bounds allocations on Linux only")
    with open("/proc/self/status") as status:
        mapped = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = mapped + headroom if hard == resource.RLIM_INFINITY else min(mapped + headroom, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@contextlib.contextmanager
def mask_bound(limit: int) -> Iterator[None]:
    previous = set_max_mask_bytes(limit)
    try:
        yield
    finally:
        set_max_mask_bytes(previous)


# ---- argument strategies ----

numpy_integer_types = st.sampled_from([np.int8, np.int32, np.int64, np.uint8, np.uint64])
hostile_scalars = st.one_of(
    st.integers(-3, 48),
    st.integers(-(2**70), 2**70),
    st.sampled_from(EXTREMES + [-e for e in EXTREMES]),
    st.builds(lambda t, v: t(v), numpy_integer_types, st.integers(0, 127)),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.just("8"),
)
hostile_sequences = st.one_of(
    st.lists(hostile_scalars, max_size=6),
    st.builds(
        lambda dtype, values: np.array(values).astype(dtype),
        st.sampled_from([np.int64, np.int32, np.uint64, np.uint8, np.float64, np.bool_, object]),
        st.lists(st.integers(0, 300), max_size=6),
    ),
    st.just(np.array([2**63], dtype=np.uint64)),
    st.just(np.zeros((2, 2), np.int64)),
    st.just(np.arange(3)[::-1]),
    hostile_scalars,
)
# Per kind of argument: values that mostly pass validation, and anything at all.
VALID = {
    "int": st.integers(0, 40),
    "optional int": st.one_of(st.none(), st.integers(0, 40)),
    "lengths": st.lists(st.integers(0, 300), max_size=5),
    "starts": st.lists(st.integers(0, 40), max_size=5, unique=True).map(sorted),
    "window": st.sampled_from([2, 4, 8, 12, 16, 24, 48, 96, 100, 200, 800]),  # multiples of 2 * n_window
}
HOSTILE = {
    "int": hostile_scalars,
    "optional int": hostile_scalars,
    "lengths": hostile_sequences,
    "starts": hostile_sequences,
    "window": hostile_scalars,
}


def arguments(**kinds: str) -> st.SearchStrategy[dict]:
    """Half the examples with every argument of its valid kind, half with each one valid or hostile."""
    valid = st.fixed_dictionaries({name: VALID[kind] for name, kind in kinds.items()})
    mixed = st.fixed_dictionaries({name: st.one_of(VALID[kind], HOSTILE[kind]) for name, kind in kinds.items()})
    return st.one_of(valid, mixed)


def as_reference_argument(value: object, kind: str) -> object:
    """An argument that passed validation, as the plain-loop references take it."""
    if kind in ("lengths", "starts"):
        return [int(v) for v in np.asarray(value).reshape(-1)]
    return None if value is None else int(value)


def entry(build: Callable, reference: Callable | None, **kinds: str) -> tuple[Callable, st.SearchStrategy, Callable]:
    """A builder, the strategy of its keyword arguments, and its reference called on accepted arguments."""

    def expected(accepted: dict) -> object:
        return reference(*(as_reference_argument(accepted[name], kind) for name, kind in kinds.items()))

    return build, arguments(**kinds), expected if reference else None


# Builder name -> (builder, strategy of its keyword arguments, reference of the accepted arguments or None).
BUILDERS: dict[str, tuple[Callable, st.SearchStrategy, Callable | None]] = {
    "subsequent_chunk_mask": entry(
        chunk.subsequent_chunk_mask, ref.subsequent_chunk_mask, size="int", chunk_size="int", num_left_chunks="int"
    ),
    "padding_mask": entry(chunk.padding_mask, ref.padding_mask, lengths="lengths", max_len="optional int"),
    "adaptive_enc_mask": entry(
        phi4mm.adaptive_enc_mask,
        ref.adaptive_enc_mask,
        x_len="int",
        chunk_start_idx="starts",
        left_window="int",
        right_window="int",
    ),
    "streaming_mask": entry(
        phi4mm.streaming_mask, ref.streaming_mask, seq_len="int", batch_size="int", chunk_size="int", left_chunk="int"
    ),
    "hs_mask": entry(
        phi4mm.hs_mask,
        ref.hs_mask,
        feature_lengths="lengths",
        max_frames="int",
        chunk_size="int",
        left_chunk="int",
        time_reduction="int",
    ),
    "subsampled_lengths": entry(
        phi4mm.subsampled_lengths, ref.subsampled_lengths, feature_lengths="lengths", time_reduction="int"
    ),
    "select_chunk_size": (
        phi4mm.select_chunk_size,
        st.one_of(arguments(chunk_size="int", left_chunk="int"), arguments(chunk_size="lengths", left_chunk="lengths")),
        None,
    ),
    "chunk_lengths": entry(qwen3_asr.chunk_lengths, ref.qwen_chunk_lengths, feature_lens="lengths", n_window="int"),
    "output_lengths": entry(qwen3_asr.output_lengths, ref.qwen_output_lengths, feature_lens="lengths", n_window="int"),
    "padded_mask_after_cnn": entry(
        qwen3_asr.padded_mask_after_cnn, ref.qwen_padded_mask_after_cnn, feature_lens="lengths", n_window="int"
    ),
    "cu_seqlens": entry(
        qwen3_asr.cu_seqlens, ref.qwen_cu_seqlens, feature_lens="lengths", n_window="int", n_window_infer="window"
    ),
    "window_mask": entry(
        qwen3_asr.window_mask, ref.qwen_window_mask, feature_lens="lengths", n_window="int", n_window_infer="window"
    ),
}


def check_builder_call(name: str, arguments: dict) -> str:
    """Call builder ``name``; assert the outcome is a correct result or a ValueError naming an argument.

    Returns ``"accepted"`` or ``"refused"``. Any other exception (MemoryError
    from an unbounded allocation included) propagates and fails the caller.
    """
    build, _, reference = BUILDERS[name]
    try:
        result = build(**arguments)
    except ValueError as error:
        message = str(error)
        assert any(argument in message for argument in arguments), f"{name}{arguments}: {message!r} names no argument"
        return "refused"
    if name == "select_chunk_size":
        assert all(type(v) is int for v in result) and result[1] >= 0
        return "accepted"
    assert isinstance(result, np.ndarray) and result.flags.c_contiguous, name
    assert result.dtype in (np.bool_, np.int64, np.int32), name
    assert result.nbytes <= FUZZ_MASK_BYTES, name
    values = [v for a in arguments.values() if a is not None for v in np.asarray(a).reshape(-1).tolist()]
    if reference is not None and result.size <= REFERENCE_CELLS and max(map(abs, values), default=0) <= REFERENCE_VALUE:
        np.testing.assert_array_equal(result, reference(arguments), err_msg=f"{name}{arguments}")
    return "accepted"


@pytest.mark.parametrize("name", list(BUILDERS))
def test_any_arguments_give_a_correct_result_or_a_named_value_error(name):
    outcomes = []

    @given(arguments=BUILDERS[name][1])
    def property_(arguments):
        with mask_bound(FUZZ_MASK_BYTES), bounded_address_space():
            outcomes.append(check_builder_call(name, arguments))

    property_()
    assert "accepted" in outcomes and "refused" in outcomes  # the strategies reach both sides


HUGE_CALLS = [
    ("subsequent_chunk_mask", {"size": 10**6, "chunk_size": 16}, "size gives a (1000000, 1000000) bool array"),
    ("padding_mask", {"lengths": [3], "max_len": 2**40}, "lengths and max_len gives a (1, 1099511627776)"),
    ("adaptive_enc_mask", {"x_len": 2**31, "chunk_start_idx": [0]}, "x_len gives"),
    (
        "streaming_mask",
        {"seq_len": 1500, "batch_size": 10**6, "chunk_size": 16, "left_chunk": 2},
        "batch_size and seq_len",
    ),
    ("hs_mask", {"feature_lengths": [5], "max_frames": 2**62, "chunk_size": 16, "left_chunk": 2}, "max_frames gives"),
    ("chunk_lengths", {"feature_lens": [2**62], "n_window": 1}, "feature_lens and n_window gives"),
    ("padded_mask_after_cnn", {"feature_lens": [2**40] * 3, "n_window": 50}, "feature_lens and n_window gives"),
    ("cu_seqlens", {"feature_lens": [2**31], "n_window": 1, "n_window_infer": 2}, "n_window_infer gives"),
    ("window_mask", {"feature_lens": [10**6], "n_window": 50}, "feature_lens gives a (130000, 130000)"),
]


@pytest.mark.parametrize(("name", "arguments", "message"), HUGE_CALLS, ids=[c[0] for c in HUGE_CALLS])
def test_huge_sizes_are_refused_before_allocating(name, arguments, message):
    """Under the default 1 GiB bound, in an address space with only 512 MiB to spare: nothing was attempted."""
    with bounded_address_space(), pytest.raises(ValueError, match=r"max_mask_bytes\(\) = 1,073,741,824") as caught:
        BUILDERS[name][0](**arguments)
    assert message in str(caught.value)


def test_the_bound_is_configurable_and_out_is_not_bounded():
    with mask_bound(1000):
        with pytest.raises(ValueError, match="size gives a"):
            chunk.subsequent_chunk_mask(32, 4)
        out = np.empty((32, 32), np.bool_)  # the caller's own memory: written, not refused
        assert chunk.subsequent_chunk_mask(32, 4, out=out) is out
        np.testing.assert_array_equal(out, ref.subsequent_chunk_mask(32, 4))
        assert chunk.subsequent_chunk_mask(31, 4).shape == (31, 31)  # 961 bytes: within the bound
    with mask_bound(2**40):  # raised: the same call is accepted
        assert chunk.subsequent_chunk_mask(32, 4).shape == (32, 32)
    with pytest.raises(ValueError, match="limit must be >= 0, got -1"):
        set_max_mask_bytes(-1)


def test_a_wide_padding_mask_leaves_no_template_behind():
    """The row template is kept between calls only up to 2^20 columns, whatever width a call asked for."""
    wide = 2**22
    mask = chunk.padding_mask([wide - 1, 0], max_len=wide)
    assert mask[0, wide - 2] and not mask[0, wide - 1] and not mask[1].any()
    assert chunk._STEP.size <= 2 * chunk._STEP_MAX_KEPT
    assert chunk.padding_mask([], max_len=2**20).shape == (0, 2**20)  # zero bytes: no template of 2^20 columns
    assert chunk._STEP.size <= 2 * chunk._STEP_MAX_KEPT


def test_empty_masks_with_huge_other_dimensions_are_refused_by_name():
    """numpy refuses (0, 2^32, 2^32) with its own 'array is too big'; found by scripts/fuzz_inputs.py."""
    with pytest.raises(
        ValueError, match=r"batch_size and seq_len gives a \(0, 4294967296, 4294967296\) bool array of 0"
    ):
        phi4mm.streaming_mask(2**32, 0, chunk_size=0, left_chunk=0)
    with pytest.raises(ValueError, match="feature_lengths and max_frames gives"):
        phi4mm.hs_mask([], 2**40, chunk_size=4, left_chunk=1)
    assert phi4mm.streaming_mask(1000, 0, chunk_size=4, left_chunk=1).shape == (0, 1000, 1000)


def test_unsigned_lengths_beyond_int64_name_the_argument():
    with pytest.raises(ValueError, match="feature_lengths must be <= 9223372036854775807, got 9223372036854775813"):
        phi4mm.subsampled_lengths(np.array([0, 2**63 + 5], np.uint64))
