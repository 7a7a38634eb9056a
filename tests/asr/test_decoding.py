"""audiomask.asr.decoding: character tokenizer, CTC head, greedy CTC decoding whole and chunk by chunk."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from audiomask.asr.decoding import BLANK_ID, CharTokenizer, GreedyCTCDecoder, greedy_decode
from audiomask.models.ctc import CTCHead
from audiomask.streaming import Phi4MMSlots

ALPHABET = "abcdefghijklmnopqrstuvwxyz '"


def reference_greedy(best: list[int], blank: int = BLANK_ID) -> list[int]:
    """Textbook greedy CTC: merge runs of the same id, then drop blanks."""
    merged = [token for i, token in enumerate(best) if i == 0 or token != best[i - 1]]
    return [token for token in merged if token != blank]


def one_hot(ids: list[list[int]], vocab_size: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(ids), vocab_size).float()


@given(text=st.text(alphabet=ALPHABET, max_size=40))
def test_tokenizer_round_trip(text):
    tokenizer = CharTokenizer(ALPHABET)
    ids = tokenizer.encode(text)
    assert all(1 <= i < tokenizer.vocab_size for i in ids)
    assert tokenizer.decode(ids) == text


@pytest.mark.parametrize(
    ("alphabet", "message"),
    [("", "alphabet must be a non-empty string, got ''"), ("abca", "alphabet must not repeat characters")],
)
def test_tokenizer_bad_alphabet(alphabet, message):
    with pytest.raises(ValueError, match=message):
        CharTokenizer(alphabet)


def test_tokenizer_bad_input():
    tokenizer = CharTokenizer("ab")
    with pytest.raises(ValueError, match="text has a character outside the alphabet 'ab': 'c'"):
        tokenizer.encode("abc")
    with pytest.raises(ValueError, match=r"ids must be < vocab_size \(3\), got 3"):
        tokenizer.decode([1, 3])
    with pytest.raises(ValueError, match="ids must be >= 0, got -1"):
        tokenizer.decode([-1])


@given(
    best=st.lists(st.lists(st.integers(0, 4), min_size=12, max_size=12), min_size=1, max_size=3),
    cuts=st.lists(st.integers(0, 12), max_size=4),
    lengths=st.lists(st.integers(0, 12), min_size=3, max_size=3),
)
def test_chunk_by_chunk_equals_whole(best, cuts, lengths):
    """Decoding the chunks of each stream in turn gives the tokens of the whole utterance."""
    logits = one_hot(best, 5)
    lengths = np.array(lengths[: len(best)])
    whole = greedy_decode(logits, lengths)
    assert whole == [reference_greedy(row[:n]) for row, n in zip(best, lengths.tolist())]
    decoder = GreedyCTCDecoder(len(best))
    pieces = [[] for _ in best]
    bounds = [0, *sorted(cuts), 12]
    for start, end in itertools.pairwise(bounds):
        real = np.clip(lengths - start, 0, end - start)
        for row, new in enumerate(decoder.push(logits[:, start:end], real)):
            pieces[row] += new
    assert pieces == whole


def test_reset_starts_new_utterances():
    decoder = GreedyCTCDecoder(1)
    assert decoder.push(one_hot([[2, 2]], 3)) == [[2]]
    assert decoder.push(one_hot([[2]], 3)) == [[]]  # continues the run
    decoder.reset()
    assert decoder.push(one_hot([[2]], 3)) == [[2]]


def test_some_streams_decoded_from_best_ids_and_reset():
    """A driver's use: the best ids of the streams of a step only, some of them new utterances."""
    decoder = GreedyCTCDecoder(3)
    assert decoder.push_best(np.array([[1, 1], [2, 0]]), np.array([2, 2]), np.array([0, 2])) == [[1], [2]]
    decoder.reset([2])
    best = np.array([[1, 3, 3], [0, 2, 2], [1, 1, 2]])
    assert decoder.push_best(best, np.array([3, 3, 1]), np.array([0, 1, 2])) == [[3], [2], [1]]
    assert decoder.push_best(np.array([[3], [2], [2]]), np.array([1, 1, 1]), np.array([0, 1, 2])) == [[], [], [2]]


def test_empty_inputs():
    assert greedy_decode(torch.zeros(0, 5, 3)) == []
    assert greedy_decode(torch.zeros(2, 0, 3)) == [[], []]


@pytest.mark.parametrize(
    ("logits", "lengths", "message"),
    [
        (torch.zeros(2, 4), None, r"logits must be a tensor of shape \(B, T, V\)"),
        (torch.zeros(1, 4, 3), [5], r"lengths must be <= n \(logits.shape\[1\]\) \(4\), got 5"),
        (torch.zeros(1, 4, 3), [1, 2], r"lengths must have 1 entries \(batch_size\), got 2"),
    ],
)
def test_bad_arguments(logits, lengths, message):
    with pytest.raises(ValueError, match=message):
        greedy_decode(logits, lengths)


def test_decoder_wrong_batch():
    with pytest.raises(ValueError, match=r"logits must be a tensor of shape \(2, n, V\), got \(3, 4, 5\)"):
        GreedyCTCDecoder(2).push(torch.zeros(3, 4, 5))


def test_ctc_head_log_probs():
    head = CTCHead(16, 5)
    log_probs = head(torch.randn(2, 7, 16).bfloat16().float())
    assert log_probs.shape == (2, 7, 5) and log_probs.dtype == torch.float32
    torch.testing.assert_close(log_probs.exp().sum(-1), torch.ones(2, 7))
    with pytest.raises(ValueError, match="vocab_size must be >= 2, got 1"):
        CTCHead(16, 1)


def test_streaming_encoder_to_text_equals_offline(tiny_phi4mm):
    """Encoder slots -> CTC head -> decoder, piece by piece, gives the offline forward's text."""
    torch.manual_seed(0)
    encoder = tiny_phi4mm()
    tokenizer = CharTokenizer(ALPHABET)
    head = CTCHead(encoder.config.hidden_size, tokenizer.vocab_size).eval()
    lengths = [333, 150]
    features = torch.randn(2, 333, 80)
    with torch.no_grad():
        outputs, output_lengths = encoder(features, lengths, chunk_size=4, left_chunk=2, mask_mode="hard")
        offline = [tokenizer.decode(ids) for ids in greedy_decode(head(outputs), output_lengths)]
        slots = Phi4MMSlots(encoder, batch_size=2, chunk_size=4, left_chunk=2)
        decoder = GreedyCTCDecoder(2)
        texts = ["", ""]
        for start in range(0, 400, 50):
            real = np.clip(np.array(lengths) - start, 0, 50)
            piece = slots.push(features[:, start : start + 50], real) if start < 333 else slots.flush()
            for row, ids in enumerate(decoder.push(head(piece), slots.last_lengths)):
                texts[row] += tokenizer.decode(ids)
    assert texts == offline and any(offline)
