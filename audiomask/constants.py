"""The audio hyperparameters every stage shares, each derived from the ones above it.

This module imports nothing, so :mod:`audiomask.masks` can use it without torch.

>>> FRAME_MS, FRAMES_PER_SECOND, WINDOW_MS
(10, 100, 25)
"""

SAMPLE_RATE = 16_000  # Hz: what every front end and encoder takes
HOP_LENGTH = 160  # samples between two feature frames
WINDOW_LENGTH = 400  # samples in one analysis window (both front ends)
FRAME_MS = 1000 * HOP_LENGTH // SAMPLE_RATE  # 10 ms of audio per feature frame
FRAMES_PER_SECOND = SAMPLE_RATE // HOP_LENGTH  # 100 feature frames per second
WINDOW_MS = 1000 * WINDOW_LENGTH // SAMPLE_RATE  # 25 ms analysis window
