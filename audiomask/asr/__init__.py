"""Streaming speech recognition: the model bundle and its file, decoding, the overlapped driver, the recognizer."""
