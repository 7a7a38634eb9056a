#!/usr/bin/env python3
"""Endpointing of ``audiomask serve``: where voice activity ends items, and how soon each item's text arrives.

Usage: python3 scripts/bench_endpoints.py --out bench/results/endpoints_cpu.json

The sample sentences (``samples/*.wav`` at 16 kHz, each cut to its speech:
the 10 ms frames louder than 1 % of its peak) are joined with pauses of
``--pauses`` seconds (then ``--tail-s`` of silence) and streamed at real time
over ``/v1/realtime`` under server VAD (``silence_duration_ms``: each of
``--silence-ms`` in turn; 16 kHz PCM16, so that the positions the server
reports are the stream's own) to a server the script starts (the shipped
model on the CPU, or ``--model``: an LLM checkpoint directory, say).

What it measures, and its criteria:

- every item's end (``input_audio_buffer.speech_stopped``'s ``audio_end_ms``:
  as OpenAI's, where its audio ends, the silence setting after the speech)
  lies in a pause (or after the last sentence), or within
  :data:`BOUNDARY_TOLERANCE_MS` of one: no sentence is split;
- every pause longer than the silence setting by :data:`BOUNDARY_TOLERANCE_MS` or more ends an item, and
  none shorter than the setting does (the detector hears speech end a little after it does);
- each item's final text (``...transcription.completed``) arrives within one
  chunk plus the silence setting of the moment the client sent its sentence's
  last sample (the silence must pass, then a step must run);
- each item's text, as the server transcribed it.

The report records the command, date, versions and machine, and each
sentence's and item's figures. Exit status 1 when a criterion is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import sys
import time
from pathlib import Path

import numpy as np
from websockets.asyncio.client import connect

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: bench/ is not installed

from audiomask.constants import SAMPLE_RATE
from bench.llm_checkpoints import RANDOM_LLMS, random_llm_directory
from bench.server_process import health, running_server

REPOSITORY = Path(__file__).resolve().parents[1]
MS_PER_S = 1000
MESSAGE_MS = 100  # audio per append, as OpenAI's examples send it
BOUNDARY_TOLERANCE_MS = 300  # a boundary lies within this of its pause's start
LOUD_FRACTION = 0.01  # a 10 ms frame louder than this fraction of the file's peak is speech
FRAME = SAMPLE_RATE // 100  # samples in 10 ms
RECEIVE_TIMEOUT_S = 30.0


def _arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pauses", default="0.3,0.5,0.8,1.2,2.0", help="seconds between sentences, comma-separated")
    parser.add_argument(
        "--silence-ms", default="250,500", help="server VAD's silence_duration_ms, each in turn (default 250,500)"
    )
    parser.add_argument("--tail-s", type=float, default=2.0, help="silence after the last sentence (default 2)")
    parser.add_argument("--device", default="cpu", help="the server's device (default cpu)")
    parser.add_argument("--ws-workers", type=int, help="the server's --ws-workers (default: its own)")
    parser.add_argument(
        "--model",
        help="the server's --model: a file or checkpoint directory, or a random LLM recogniser (llm_tiny, llm_0.6b, "
        "llm_1.7b: bench.llm_checkpoints.RANDOM_LLMS, saved to a temporary directory); default: the shipped model",
    )
    parser.add_argument("--chunk-ms", type=int, help="the server's --chunk-ms (default: the model's)")
    parser.add_argument("--out", type=Path, help="write the JSON report here")
    return parser.parse_args(argv)


def _speech(samples: np.ndarray) -> tuple[int, int]:
    """First and last sample of the frames louder than :data:`LOUD_FRACTION` of the peak."""
    frames = np.abs(samples[: len(samples) // FRAME * FRAME]).reshape(-1, FRAME).max(axis=1)
    loud = np.flatnonzero(frames > LOUD_FRACTION * np.abs(samples).max())
    return int(loud[0]) * FRAME, int(loud[-1] + 1) * FRAME


def _joined(pauses_s: list[float], tail_s: float) -> tuple[np.ndarray, list[dict]]:
    """The sentences, each cut to its speech, in turn with the pauses between; each one's file and span."""
    from audiomask.audio import load

    files = sorted((REPOSITORY / "samples").glob("*.wav"))
    parts, sentences, position = [], [], 0
    for index in range(len(pauses_s) + 1):
        path = files[index % len(files)]
        samples = load(path)[0]
        first, last = _speech(samples)
        sentences.append({"file": path.name, "speech_start": position, "speech_end": position + last - first})
        parts.append(samples[first:last])
        position += last - first
        pause = round((pauses_s[index] if index < len(pauses_s) else tail_s) * SAMPLE_RATE)
        parts.append(np.zeros(pause, np.float32))
        position += pause
    return np.concatenate(parts), sentences


async def _stream(url: str, samples: np.ndarray, silence_ms: int) -> tuple[list[tuple[float, dict]], list[float]]:
    """Stream ``samples`` at real time over the realtime route: every event with its arrival time, and the time
    each message was sent (``time.perf_counter``)."""
    pcm = np.clip(np.rint(samples * 32768), -32768, 32767).astype("<i2")
    session = {
        "type": "transcription",
        "audio": {
            "input": {
                "format": {"type": "audio/pcm", "rate": SAMPLE_RATE},
                "turn_detection": {"type": "server_vad", "silence_duration_ms": silence_ms},
            }
        },
    }
    step = MESSAGE_MS * SAMPLE_RATE // MS_PER_S
    events: list[tuple[float, dict]] = []
    sent_at: list[float] = []
    async with connect(url + "/v1/realtime?intent=transcription", proxy=None, max_size=None) as ws:
        await ws.recv()
        await ws.send(json.dumps({"type": "session.update", "session": session}))

        async def receive() -> None:
            async for message in ws:
                events.append((time.perf_counter(), json.loads(message)))

        receiver = asyncio.create_task(receive())
        started = time.perf_counter()
        for index, start in enumerate(range(0, len(pcm), step)):
            await asyncio.sleep(max(0.0, started + index * MESSAGE_MS / MS_PER_S - time.perf_counter()))
            audio = base64.b64encode(pcm[start : start + step].tobytes()).decode()
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
            sent_at.append(time.perf_counter())
        deadline = time.perf_counter() + RECEIVE_TIMEOUT_S
        while time.perf_counter() < deadline and _open_items(events):
            await asyncio.sleep(0.05)
        receiver.cancel()
    return events, sent_at


def _open_items(events: list[tuple[float, dict]]) -> bool:
    """Whether an item has started and its final text not come yet."""
    started = {e["item_id"] for _, e in events if e["type"] == "input_audio_buffer.speech_started"}
    done = {e["item_id"] for _, e in events if e["type"].endswith("transcription.completed")}
    return bool(started - done)


def _report(
    events: list[tuple[float, dict]],
    sent_at: list[float],
    sentences: list[dict],
    total: int,
    silence_ms: int,
    chunk_ms: int,
) -> dict:
    step = MESSAGE_MS * SAMPLE_RATE // MS_PER_S
    ms = MS_PER_S / SAMPLE_RATE
    pauses = [(a["speech_end"], b["speech_start"]) for a, b in zip(sentences, sentences[1:])]
    quiet = [*pauses, (sentences[-1]["speech_end"], total)]
    items = {}
    for arrived, event in events:
        kind = event["type"]
        if kind == "input_audio_buffer.speech_started":
            items[event["item_id"]] = {"audio_start_ms": event["audio_start_ms"]}
        elif kind == "input_audio_buffer.speech_stopped":
            items[event["item_id"]]["audio_end_ms"] = event["audio_end_ms"]
        elif kind.endswith("transcription.completed"):
            items[event["item_id"]].update(text=event["transcript"], completed_at=arrived)
    rows, split, marked = [], [], set()
    for item in items.values():
        end = item.get("audio_end_ms")
        place = (
            None if end is None else next((i for i, (a, b) in enumerate(quiet) if a * ms - 300 <= end <= b * ms), None)
        )
        if end is not None and place is None:
            split.append(end)
        row = {"audio_start_ms": item["audio_start_ms"], "audio_end_ms": end, "text": item.get("text")}
        if place is not None:
            start_ms = quiet[place][0] * ms
            marked.add(place)
            row |= {"pause": place, "boundary_from_pause_start_ms": round(end - start_ms)}
            last_sample_message = min(quiet[place][0] // step, len(sent_at) - 1)  # the sentence's last sample
            if "completed_at" in item:
                row["final_after_speech_end_ms"] = round((item["completed_at"] - sent_at[last_sample_message]) * 1000)
        rows.append(row)
    must = {i for i, (a, b) in enumerate(pauses) if (b - a) * ms >= silence_ms + BOUNDARY_TOLERANCE_MS}
    may = {i for i, (a, b) in enumerate(pauses) if (b - a) * ms >= silence_ms}
    marked_pauses = {i for i in marked if i < len(pauses)}
    limit_ms = chunk_ms + silence_ms
    finals = [row.get("final_after_speech_end_ms") for row in rows]
    criteria = {
        "no_sentence_split": not split,
        "every_long_pause_ends_an_item_and_no_short_one": must <= marked_pauses <= may,
        "finals_within_chunk_plus_silence": all(f is not None and f <= limit_ms for f in finals),
    }
    return {
        "silence_ms": silence_ms,
        "final_limit_ms": limit_ms,
        "items": rows,
        "split_inside_sentence_ms": split,
        "criteria": criteria,
    }


def main(argv: list[str]) -> int:
    args = _arguments(argv)
    from audiomask.bench.environment import capture_environment, write_result

    pauses_s = [float(p) for p in args.pauses.split(",")]
    samples, sentences = _joined(pauses_s, args.tail_s)
    runs = []
    with contextlib.ExitStack() as stack:
        model = random_llm_directory(args.model, args.device, stack) if args.model in RANDOM_LLMS else args.model
        options = {"--device": args.device, "--ws-workers": args.ws_workers, "--model": model}
        with running_server(options | {"--chunk-ms": args.chunk_ms}) as served:
            chunk_ms = health(served.http_url)[1]["chunk_ms"]
            for silence_ms in (int(s) for s in args.silence_ms.split(",")):
                events, sent_at = asyncio.run(_stream(served.ws_url, samples, silence_ms))
                runs.append(_report(events, sent_at, sentences, len(samples), silence_ms, chunk_ms))
                print(json.dumps({"silence_ms": silence_ms, **runs[-1]["criteria"]}))
    ms = MS_PER_S / SAMPLE_RATE
    report = {
        "settings": {
            "pauses_s": pauses_s,
            "tail_s": args.tail_s,
            "chunk_ms": chunk_ms,
            "message_ms": MESSAGE_MS,
            "boundary_tolerance_ms": BOUNDARY_TOLERANCE_MS,
        },
        "sentences": [
            s | {"speech_start_ms": round(s["speech_start"] * ms), "speech_end_ms": round(s["speech_end"] * ms)}
            for s in sentences
        ],
        "runs": runs,
    }
    if args.out:
        write_result(args.out, capture_environment(["scripts/bench_endpoints.py", *argv]) | report)
    return 0 if all(all(run["criteria"].values()) for run in runs) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
