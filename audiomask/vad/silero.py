"""Silero VAD's 16 kHz network in plain PyTorch, with its recurrent state passed in and out.

The ``silero-vad`` package ships the network as TorchScript (``data/silero_vad.jit``,
what its ``load_silero_vad()`` returns), which keeps one batch's state inside
the model and resets it whenever the batch size changes. A server's streams
join and leave at any moment, so each needs its own state row: this module
rebuilds the 16 kHz network from that file's weights with the state explicit,
and one call scores a window of every stream at once, whatever their number.
(The package's ``silero_vad_16k.safetensors`` holds other weights, which score
differently; the TorchScript model is the one its API serves.)

A window is :data:`WINDOW_SAMPLES` new samples (32 ms) after the
:data:`CONTEXT_SAMPLES` before them (zeros at a stream's start), as Silero's
own wrappers feed it; its score is the probability of speech in it. Only the
recurrent cell runs window after window: the convolutions of every window of
every stream run in one batch, and the cell as one LSTM over each stream's
windows, so that a call costs a handful of operators whatever the windows.

>>> import torch
>>> vad = SileroVAD.from_package()
>>> windows = torch.zeros(3, 4, WINDOW_SPAN)                   # 3 streams, up to 4 windows each
>>> scores, state = vad(windows, torch.tensor([4, 1, 2]), vad.initial_state(3))
>>> scores.shape, state.shape, bool((scores < 0.5).all())    # silence
(torch.Size([3, 4]), torch.Size([2, 3, 128]), True)
"""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from audiomask.constants import SAMPLE_RATE

__all__ = [
    "CONTEXT_SAMPLES",
    "HIDDEN_SIZE",
    "TORCHSCRIPT_NAMES",
    "WEIGHTS_FILE",
    "WINDOW_MS",
    "WINDOW_SAMPLES",
    "WINDOW_SPAN",
    "SileroVAD",
    "package_weights",
]

WINDOW_SAMPLES = 512  # new samples per window at 16 kHz: what the network was trained on
WINDOW_MS = 1000 * WINDOW_SAMPLES // SAMPLE_RATE  # 32 ms
CONTEXT_SAMPLES = 64  # samples of the previous window each window starts with
WINDOW_SPAN = CONTEXT_SAMPLES + WINDOW_SAMPLES  # samples the network reads per window
N_FFT = 256  # the learned STFT's window, samples
STFT_HOP = N_FFT // 2  # 128 samples
STFT_BINS = N_FFT // 2 + 1  # 129 magnitude bins
REFLECT_PAD = CONTEXT_SAMPLES  # the window is reflect-padded on the right by this many samples
HIDDEN_SIZE = 128  # the LSTM cell's state: (h, c), 128 each
WEIGHTS_FILE = ("data", "silero_vad.jit")  # inside the silero_vad package
# The TorchScript model's 16 kHz weights (its submodule ``_model``) by the names of this module's.
TORCHSCRIPT_NAMES = {
    "stft.forward_basis_buffer": "stft_conv.weight",
    "encoder.0.reparam_conv": "conv1",
    "encoder.1.reparam_conv": "conv2",
    "encoder.2.reparam_conv": "conv3",
    "encoder.3.reparam_conv": "conv4",
    "decoder.rnn": "lstm",
    "decoder.decoder.2": "final_conv",
}


def package_weights() -> Path:
    """The TorchScript model file of the installed ``silero-vad`` package.

    The package is located, not imported: its ``__init__`` sets torch's thread count to one for the whole
    process. ``ModuleNotFoundError`` names the extra to install when it is missing.
    """
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "voice-activity detection needs the silero-vad package: pip install 'audiomask[serve]' (or silero-vad)"
        )
    path = Path(next(iter(spec.submodule_search_locations))).joinpath(*WEIGHTS_FILE)
    if not path.is_file():
        raise FileNotFoundError(f"the silero-vad package has no {path.name} (found {path.parent}): reinstall it")
    return path


def _own_name(name: str) -> str:
    """This module's name for the TorchScript model's weight ``name`` (its LSTM cell's are the one layer's of
    an LSTM: ``weight_ih`` is ``weight_ih_l0``)."""
    if name in TORCHSCRIPT_NAMES:
        return TORCHSCRIPT_NAMES[name]
    module, _, kind = name.rpartition(".")
    own = TORCHSCRIPT_NAMES[module]
    return f"{own}.{kind}_l0" if own == "lstm" else f"{own}.{kind}"


class SileroVAD(nn.Module):
    """Silero VAD v5+ (16 kHz): a learned STFT, four convolutions, an LSTM cell and a sigmoid head.

    ``forward(windows, lengths, state)``: ``windows`` ``(B, D, WINDOW_SPAN)`` float32, full scale +-1, stream
    ``b``'s first ``lengths[b]`` (``(B,)`` int64, each in 1..D) in order, the rest padding; ``state``
    ``(2, B, HIDDEN_SIZE)`` float32 (``h`` then ``c``; :meth:`initial_state` for new streams). Returns
    ``(scores, state)``: ``(B, D)`` probabilities of speech in [0, 1] (padding's are meaningless), and each
    stream's state after its windows.
    """

    def __init__(self) -> None:
        super().__init__()
        self.stft_conv = nn.Conv1d(1, 2 * STFT_BINS, N_FFT, stride=STFT_HOP, bias=False)
        self.conv1 = nn.Conv1d(STFT_BINS, 128, 3, padding=1)
        self.conv2 = nn.Conv1d(128, 64, 3, stride=2, padding=1)
        self.conv3 = nn.Conv1d(64, 64, 3, stride=2, padding=1)
        self.conv4 = nn.Conv1d(64, HIDDEN_SIZE, 3, padding=1)
        self.lstm = nn.LSTM(HIDDEN_SIZE, HIDDEN_SIZE, batch_first=True)
        self.final_conv = nn.Conv1d(HIDDEN_SIZE, 1, 1)

    @classmethod
    def from_package(cls, path: str | Path | None = None) -> SileroVAD:
        """The network with the 16 kHz weights of the TorchScript model at ``path`` (default:
        :func:`package_weights`), in eval mode on the CPU."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch.jit.load is deprecated; the file is TorchScript
            scripted = torch.jit.load(str(path or package_weights()), map_location="cpu")
        weights = {_own_name(name): tensor for name, tensor in scripted._model.state_dict().items()}
        model = cls()
        model.load_state_dict(weights)
        return model.eval().requires_grad_(False)

    @staticmethod
    def initial_state(batch: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """``(2, batch, HIDDEN_SIZE)`` zeros: the state of streams that have heard nothing yet."""
        return torch.zeros(2, batch, HIDDEN_SIZE, device=device)

    def forward(
        self, windows: torch.Tensor, lengths: torch.Tensor, state: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        batch, depth, span = windows.shape
        x = F.pad(windows.reshape(batch * depth, 1, span), (0, REFLECT_PAD), mode="reflect")
        x = self.stft_conv(x)
        x = torch.sqrt(x[:, :STFT_BINS] ** 2 + x[:, STFT_BINS:] ** 2)
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.relu(self.conv3(x))
        x = F.relu(self.conv4(x)).reshape(batch, depth, HIDDEN_SIZE)
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, (h, c) = self.lstm(packed, (state[:1].contiguous(), state[1:].contiguous()))
        out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=depth)
        scores = torch.sigmoid(self.final_conv(F.relu(out).transpose(1, 2))).squeeze(1)
        return scores, torch.cat((h, c))
