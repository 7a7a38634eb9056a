"""Hostile arguments to every mask builder: a correct result or a ValueError naming an argument, never more.

Each builder has a strategy of arguments it must accept, derived from its
contract (``n_window_infer`` a multiple of ``2 * n_window``, chunk starts
within ``x_len``, ...): every draw must give the result of the plain-loop
reference (the ``mask_reference`` fixture). The hostile properties take such
arguments and replace any of them with huge or negative integers (beyond
int64 too), floats, bools, ``None``, strings, numpy scalars and arrays of
every dtype and rank: every draw must give a correct result or a
``ValueError`` naming an argument. Both run inside an address space only
``HEADROOM_BYTES`` larger than the process's, so an unbounded allocation
fails the test (as ``MemoryError``) instead of exhausting the machine.

For many more examples, run them under the ``fuzz`` hypothesis profile:
``python -m pytest tests/masks/test_hostile.py --hypothesis-profile=fuzz``.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass

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

# ---- arguments every builder must accept ----

sizes = st.integers(0, 40)  # tokens, frames, batch rows, chunks of context
positive_sizes = st.integers(1, 40)  # chunk sizes, n_window, time_reduction
signed_chunk_sizes = st.integers(-3, 40)  # <= 0: full attention (Phi-4MM); < 0: unlimited left (WeNet)
frame_lengths = st.lists(st.integers(0, 300), max_size=5)


@st.composite
def adaptive_enc_mask_arguments(draw: st.DrawFn) -> dict:
    x_len = draw(sizes)
    starts = sorted(draw(st.sets(st.integers(0, x_len), max_size=5)))  # strictly increasing, within [0, x_len]
    return {"x_len": x_len, "chunk_start_idx": starts, "left_window": draw(sizes), "right_window": draw(sizes)}


@st.composite
def padding_mask_arguments(draw: st.DrawFn) -> dict:
    lengths = draw(frame_lengths)
    extra = draw(st.none() | sizes)  # max_len: none, or at least the longest length
    return {"lengths": lengths, "max_len": None if extra is None else max(lengths, default=0) + extra}


@st.composite
def hs_mask_arguments(draw: st.DrawFn) -> dict:
    lengths = draw(frame_lengths)
    return {
        "feature_lengths": lengths,
        "max_frames": max(lengths, default=0) + draw(sizes),
        "chunk_size": draw(signed_chunk_sizes),
        "left_chunk": draw(sizes),
        "time_reduction": draw(positive_sizes),
    }


@st.composite
def chunk_size_lists(draw: st.DrawFn) -> dict:
    """Variable chunk size training: two lists of the same non-zero length."""
    count = draw(st.integers(1, 5))
    return {
        "chunk_size": draw(st.lists(signed_chunk_sizes, min_size=count, max_size=count)),
        "left_chunk": draw(st.lists(sizes, min_size=count, max_size=count)),
    }


@st.composite
def window_arguments(draw: st.DrawFn) -> dict:
    n_window = draw(positive_sizes)
    windows_chunks = draw(st.integers(1, 8))  # n_window_infer: a multiple of the 2 * n_window frames of a chunk
    return {"feature_lens": draw(frame_lengths), "n_window": n_window, "n_window_infer": 2 * n_window * windows_chunks}


chunking_arguments = st.fixed_dictionaries({"feature_lens": frame_lengths, "n_window": positive_sizes})

# ---- hostile values, per kind of argument ----

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
HOSTILE = {"int": hostile_scalars, "lengths": hostile_sequences}


@dataclass(frozen=True)
class Builder:
    """A builder, the arguments it must accept, and what its hostile arguments may be."""

    build: Callable
    valid: st.SearchStrategy[dict]  # keyword arguments the builder must accept
    kinds: dict[str, str]  # argument -> kind of hostile value ("int" or "lengths"), in the reference's order
    reference: str | None  # the mask_reference function of the accepted arguments, or None

    def hostile(self) -> st.SearchStrategy[dict]:
        """Valid arguments with any of them (none, some or all) replaced by a hostile value of its kind."""
        replacements = st.fixed_dictionaries({}, optional={name: HOSTILE[kind] for name, kind in self.kinds.items()})
        return st.builds(lambda valid, replaced: {**valid, **replaced}, self.valid, replacements)


BUILDERS: dict[str, Builder] = {
    "subsequent_chunk_mask": Builder(
        chunk.subsequent_chunk_mask,
        st.fixed_dictionaries({"size": sizes, "chunk_size": positive_sizes, "num_left_chunks": signed_chunk_sizes}),
        {"size": "int", "chunk_size": "int", "num_left_chunks": "int"},
        "subsequent_chunk_mask",
    ),
    "padding_mask": Builder(
        chunk.padding_mask, padding_mask_arguments(), {"lengths": "lengths", "max_len": "int"}, "padding_mask"
    ),
    "adaptive_enc_mask": Builder(
        phi4mm.adaptive_enc_mask,
        adaptive_enc_mask_arguments(),
        {"x_len": "int", "chunk_start_idx": "lengths", "left_window": "int", "right_window": "int"},
        "adaptive_enc_mask",
    ),
    "streaming_mask": Builder(
        phi4mm.streaming_mask,
        st.fixed_dictionaries(
            {"seq_len": sizes, "batch_size": sizes, "chunk_size": signed_chunk_sizes, "left_chunk": sizes}
        ),
        {"seq_len": "int", "batch_size": "int", "chunk_size": "int", "left_chunk": "int"},
        "streaming_mask",
    ),
    "hs_mask": Builder(
        phi4mm.hs_mask,
        hs_mask_arguments(),
        {
            "feature_lengths": "lengths",
            "max_frames": "int",
            "chunk_size": "int",
            "left_chunk": "int",
            "time_reduction": "int",
        },
        "hs_mask",
    ),
    "subsampled_lengths": Builder(
        phi4mm.subsampled_lengths,
        st.fixed_dictionaries({"feature_lengths": frame_lengths, "time_reduction": positive_sizes}),
        {"feature_lengths": "lengths", "time_reduction": "int"},
        "subsampled_lengths",
    ),
    "select_chunk_size": Builder(
        phi4mm.select_chunk_size,
        st.fixed_dictionaries({"chunk_size": signed_chunk_sizes, "left_chunk": sizes}) | chunk_size_lists(),
        {"chunk_size": "lengths", "left_chunk": "lengths"},  # an integer or a list: hostile sequences hold both
        None,
    ),
    "chunk_lengths": Builder(
        qwen3_asr.chunk_lengths,
        chunking_arguments,
        {"feature_lens": "lengths", "n_window": "int"},
        "qwen_chunk_lengths",
    ),
    "output_lengths": Builder(
        qwen3_asr.output_lengths,
        chunking_arguments,
        {"feature_lens": "lengths", "n_window": "int"},
        "qwen_output_lengths",
    ),
    "padded_mask_after_cnn": Builder(
        qwen3_asr.padded_mask_after_cnn,
        chunking_arguments,
        {"feature_lens": "lengths", "n_window": "int"},
        "qwen_padded_mask_after_cnn",
    ),
    "cu_seqlens": Builder(
        qwen3_asr.cu_seqlens,
        window_arguments(),
        {"feature_lens": "lengths", "n_window": "int", "n_window_infer": "int"},
        "qwen_cu_seqlens",
    ),
    "window_mask": Builder(
        qwen3_asr.window_mask,
        window_arguments(),
        {"feature_lens": "lengths", "n_window": "int", "n_window_infer": "int"},
        "qwen_window_mask",
    ),
}


def as_reference_argument(value: object, kind: str) -> object:
    """An argument that passed validation, as the plain-loop references take it."""
    if kind == "lengths":
        return [int(v) for v in np.asarray(value).reshape(-1)]
    return None if value is None else int(value)


def check_builder_call(name: str, arguments: dict, mask_reference: object) -> str:
    """Call builder ``name``; assert the outcome is a correct result or a ValueError naming an argument.

    Returns ``"accepted"`` or ``"refused"``. Any other exception (MemoryError
    from an unbounded allocation included) propagates and fails the caller.
    """
    builder = BUILDERS[name]
    try:
        result = builder.build(**arguments)
    except ValueError as error:
        message = str(error)
        assert any(argument in message for argument in arguments), f"{name}{arguments}: {message!r} names no argument"
        return "refused"
    if builder.reference is None:  # select_chunk_size: one (chunk_size, left_chunk) pair
        assert all(type(v) is int for v in result) and result[1] >= 0
        return "accepted"
    assert isinstance(result, np.ndarray) and result.flags.c_contiguous, name
    assert result.dtype in (np.bool_, np.int64, np.int32), name
    assert result.nbytes <= FUZZ_MASK_BYTES, name
    values = [v for a in arguments.values() if a is not None for v in np.asarray(a).reshape(-1).tolist()]
    if result.size <= REFERENCE_CELLS and max(map(abs, values), default=0) <= REFERENCE_VALUE:
        reference = getattr(mask_reference, builder.reference)
        expected = reference(*(as_reference_argument(arguments[a], kind) for a, kind in builder.kinds.items()))
        np.testing.assert_array_equal(result, expected, err_msg=f"{name}{arguments}")
    return "accepted"


@pytest.mark.parametrize("name", list(BUILDERS))
def test_valid_arguments_give_the_reference_result(name, mask_reference, mask_bound, bounded_address_space):
    @given(arguments=BUILDERS[name].valid)
    def property_(arguments):
        with mask_bound(FUZZ_MASK_BYTES), bounded_address_space(HEADROOM_BYTES):
            assert check_builder_call(name, arguments, mask_reference) == "accepted"

    property_()


@pytest.mark.parametrize("name", list(BUILDERS))
def test_any_arguments_give_a_correct_result_or_a_named_value_error(
    name, mask_reference, mask_bound, bounded_address_space
):
    outcomes = []

    @given(arguments=BUILDERS[name].hostile())
    def property_(arguments):
        with mask_bound(FUZZ_MASK_BYTES), bounded_address_space(HEADROOM_BYTES):
            outcomes.append(check_builder_call(name, arguments, mask_reference))

    property_()
    assert "refused" in outcomes  # the hostile values reach the argument checks


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
def test_huge_sizes_are_refused_before_allocating(name, arguments, message, bounded_address_space):
    """Under the default 1 GiB bound, in an address space with only 512 MiB to spare: nothing was attempted."""
    with (
        bounded_address_space(HEADROOM_BYTES),
        pytest.raises(ValueError, match=r"max_mask_bytes\(\) = 1,073,741,824") as caught,
    ):
        BUILDERS[name].build(**arguments)
    assert message in str(caught.value)


def test_the_bound_is_configurable_and_out_is_not_bounded(mask_reference, mask_bound):
    with mask_bound(1000):
        with pytest.raises(ValueError, match="size gives a"):
            chunk.subsequent_chunk_mask(32, 4)
        out = np.empty((32, 32), np.bool_)  # the caller's own memory: written, not refused
        assert chunk.subsequent_chunk_mask(32, 4, out=out) is out
        np.testing.assert_array_equal(out, mask_reference.subsequent_chunk_mask(32, 4))
        assert chunk.subsequent_chunk_mask(31, 4).shape == (31, 31)  # 961 bytes: within the bound
    with mask_bound(2**40):  # raised: the same call is accepted
        assert chunk.subsequent_chunk_mask(32, 4).shape == (32, 32)
    with pytest.raises(ValueError, match="limit must be >= 0, got -1"):
        set_max_mask_bytes(-1)


def test_wide_padding_masks_keep_no_row_template():
    """Row templates are kept between calls only up to 2^20 columns (2 MiB), whatever width a call asked for."""
    wide = 2**22  # a template of this many columns holds 8 MiB
    tracemalloc.start()
    try:
        assert chunk.padding_mask([], max_len=wide).shape == (0, wide)
        _, peak = tracemalloc.get_traced_memory()
        mask = chunk.padding_mask([wide - 1, 0], max_len=wide)
        assert mask[0, wide - 2] and not mask[0, wide - 1] and not mask[1].any()
        del mask
        retained, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2**20  # an empty mask builds no template
    assert retained < 2**20  # the wide template went with the call


def test_empty_masks_with_huge_other_dimensions_are_refused_by_name():
    """numpy refuses (0, 2^32, 2^32) with its own 'array is too big': refused here first, naming the arguments."""
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
