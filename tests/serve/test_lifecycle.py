"""The server's life: health and page, a graceful stop on SIGTERM, TLS, and the CLI's refusal of bad options."""

from __future__ import annotations

import asyncio
import gc
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from importlib.resources import files

import numpy as np
import pytest

from audiomask.serve.client import DEFAULT_MESSAGE_SAMPLES, stream_audio

CLI_TIMEOUT_S = 60.0
SIGTERM_AFTER_S = 1.0  # seconds into a 3 s sample streamed at real time: after the first partial
STOP_TIMEOUT_S = 15.0
UNASSIGNED_ADDRESS = "192.0.2.1"  # TEST-NET-1 (RFC 5737): no interface of this machine has it


def test_health_reports_the_ready_server_and_the_page_is_served(served):
    status, health = served.health()
    assert status == 200
    assert health["status"] == "ready"
    assert health["max_connections"] == 16 and health["device"] == "cpu" and health["chunk_ms"] > 0
    assert health["max_wait_ms"] == health["chunk_ms"]  # on the CPU a ready chunk waits one chunk by default
    page = files("audiomask.serve").joinpath("static", "index.html")
    try:
        with urllib.request.urlopen(served.url + "/", timeout=5) as response:
            status, content_type, body = response.status, response.headers["Content-Type"], response.read()
    except urllib.error.HTTPError as error:
        status, content_type, body = error.code, "", b""
    if page.is_file():
        assert (status, content_type.split(";")[0]) == (200, "text/html")
        assert body == page.read_bytes()
    else:
        assert status == 404


def test_health_times_the_served_steps_not_the_warm_up(start_server, sample_audio, expected_texts):
    server = start_server("--max-connections", "2")
    status, ready = server.health()
    assert status == 200 and ready["cycles"] >= 1, ready  # the warm-up ran its steps ...
    assert ready["recent_cycles"] == {}, ready  # ... which /health does not count among the recent ones
    result = asyncio.run(stream_audio(server.ws_url + "/", sample_audio["numbers.wav"]))
    assert result.text == expected_texts["numbers.wav"]
    served = server.health()[1]
    assert served["recent_cycles"]["cycles"] == served["cycles"] - ready["cycles"] > 0, served
    assert served["chunks"] - ready["chunks"] >= served["cycles"] - ready["cycles"], served  # a stream or more a step


def test_sigterm_finishes_the_streams_in_flight_and_exits_0(start_server, sample_audio):
    server = start_server("--max-connections", "4")
    samples = sample_audio["hello_world.wav"]

    async def stop_mid_stream():
        sherpa = asyncio.create_task(stream_audio(server.ws_url + "/", samples, realtime=True))
        wenet = asyncio.create_task(stream_audio(server.ws_url + "/wenet", samples, protocol="wenet", realtime=True))
        await asyncio.sleep(SIGTERM_AFTER_S)
        server.process.send_signal(signal.SIGTERM)
        return await sherpa, await wenet

    results = asyncio.run(stop_mid_stream())
    assert server.process.wait(STOP_TIMEOUT_S) == 0, server.log()
    for result in results:
        assert 0 < len(result.sent_at) < len(samples) / DEFAULT_MESSAGE_SAMPLES, "SIGTERM did not come mid-stream"
        assert result.final_at > 0, "no final result"
        assert result.partials, "no partial result before SIGTERM"
        assert result.text.startswith(result.partials[-1][1])


def _self_signed(tmp_path):
    """A certificate for 127.0.0.1 and its key, PEM files made with the cryptography package."""
    pytest.importorskip("cryptography", reason="the cryptography package makes the test certificate")
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .sign(key, hashes.SHA256())
    )
    certfile, keyfile = tmp_path / "cert.pem", tmp_path / "key.pem"
    certfile.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    keyfile.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return certfile, keyfile


def test_certfile_and_keyfile_serve_wss(start_server, tmp_path, sample_audio, expected_texts, insecure_ssl_context):
    certfile, keyfile = _self_signed(tmp_path)
    server = start_server("--certfile", str(certfile), "--keyfile", str(keyfile), "--max-connections", "2")
    assert server.ws_url.startswith("wss://")
    result = asyncio.run(
        stream_audio(server.ws_url + "/", sample_audio["weather.wav"], ssl_context=insecure_ssl_context)
    )
    assert result.text == expected_texts["weather.wav"]


def test_a_front_end_in_a_process_of_its_own_gives_the_texts_of_audiomask_transcribe(
    start_server, sample_audio, expected_texts
):
    server = start_server("--frontend-workers", "1", "--max-connections", "2")
    names = ["hello_world.wav", "numbers.wav"]

    async def both():
        return await asyncio.gather(
            stream_audio(server.ws_url + "/", sample_audio[names[0]]),
            stream_audio(server.ws_url + "/wenet", sample_audio[names[1]], protocol="wenet"),
        )

    results = asyncio.run(both())
    assert [result.text for result in results] == [expected_texts[name] for name in names]


@pytest.mark.parametrize(
    ("arguments", "words"),
    [
        (["--port", "70000"], "--port must be <= 65535, got 70000"),
        (["--max-connections", "0"], "--max-connections must be >= 1, got 0"),
        (["--max-message-bytes", "2"], "--max-message-bytes must be >= 4, got 2"),
        (["--idle-timeout-s", "0"], "--idle-timeout-s must be a positive number of seconds, got 0.0"),
        (["--certfile", "cert.pem"], "--certfile and --keyfile go together"),
        (["--certfile", "missing.pem", "--keyfile", "missing.pem"], "cannot be used for TLS"),
        (["--gpus-per-replica", "1"], "--gpus-per-replica goes with --ray"),
        (["--replicas", "0"], "--replicas must be >= 1, got 0"),
        (["--frontend-workers", "-1"], "--frontend-workers must be >= 0, got -1"),
        (["--max-wait-ms", "-5"], "--max-wait-ms must be >= 0, got -5"),
        (["--ws-workers", "-1"], "--ws-workers must be >= 0, got -1"),
        (["--endpoint-silence-s", "-1"], "--endpoint-silence-s must be a number of seconds >= 0, got -1.0"),
        (["--vad-threshold", "1.5"], "--vad-threshold: threshold must be in (0, 1), got 1.5"),
        (["--max-segment-s", "0"], "--max-segment-s must be a positive number of seconds, got 0.0"),
        (["--max-segment-s", "inf"], "--max-segment-s must be a positive number of seconds, got inf"),
        (["--ws-workers", "2", "--ray"], "--ws-workers goes without --ray"),
        (
            ["--max-connections", "4", "--frontend-workers", "8"],
            "--frontend-workers must be at most --max-connections (4)",
        ),
    ],
)
def test_bad_options_are_one_line_and_exit_2(arguments, words):
    result = subprocess.run(
        [sys.executable, "-m", "audiomask", "serve", *arguments],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("audiomask: error: "), result.stderr
    assert words in result.stderr


@pytest.fixture
def held_port():
    """A loopback port that a listening socket of another server holds (with ``SO_REUSEPORT`` when asked)."""
    holders = []

    def hold(reuse_port: bool) -> int:
        holder = socket.socket()
        holders.append(holder)
        if reuse_port:
            holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        return holder.getsockname()[1]

    yield hold
    for holder in holders:
        holder.close()


@pytest.mark.parametrize(
    ("holder", "replicas"),
    # another program's socket; another `audiomask serve --replicas`' (SO_REUSEPORT); an address not of this host
    [("plain", "1"), ("reuse-port", "2"), ("no-such-address", "1")],
)
def test_an_address_it_cannot_listen_on_is_one_line_and_exit_2_before_any_banner(held_port, holder, replicas):
    if holder == "no-such-address":
        host, port = UNASSIGNED_ADDRESS, 0
        words = f"{UNASSIGNED_ADDRESS}:0"
    else:
        host, port = "127.0.0.1", held_port(reuse_port=holder == "reuse-port")
        words = f"127.0.0.1:{port}"
    result = subprocess.run(
        [sys.executable, "-m", "audiomask", "serve", "--host", host, "--port", str(port), "--replicas", replicas]
        + ["--device", "cpu"],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("audiomask: error: "), result.stderr
    assert words in result.stderr and "cannot listen" in result.stderr, result.stderr


def test_the_engine_freezes_what_it_loaded_and_lowers_the_switch_interval_on_the_cpu_never_raising_it():
    from audiomask.asr.checkpoint import load_model
    from audiomask.asr.recognizer import StreamingRecognizer
    from audiomask.serve.engine import SWITCH_INTERVAL_S, Engine
    from audiomask.serve.settings import ServeSettings

    async def switch_interval_once_started(recognizer: StreamingRecognizer) -> float:
        engine = Engine(ServeSettings(max_connections=2), recognizer)
        await engine.start()
        try:
            while engine.state.value == "loading":  # the interval is set as the recognizer is taken up
                await asyncio.sleep(0.01)
            assert gc.get_freeze_count() > 0  # ... and what was loaded is left out of full collections
            return sys.getswitchinterval()
        finally:
            await engine.stop()

    before = sys.getswitchinterval()
    try:
        with StreamingRecognizer(load_model(), "cpu", max_streams=2) as recognizer:
            sys.setswitchinterval(0.005)  # Python's default
            assert asyncio.run(switch_interval_once_started(recognizer)) == pytest.approx(SWITCH_INTERVAL_S)
            sys.setswitchinterval(SWITCH_INTERVAL_S / 2)  # the user's own, shorter: kept
            assert asyncio.run(switch_interval_once_started(recognizer)) == pytest.approx(SWITCH_INTERVAL_S / 2)
    finally:
        sys.setswitchinterval(before)


class _Quiet:
    """A connection's listener that keeps nothing (the test reads the feeds)."""

    def results(self, segments: list) -> None:
        pass

    def failed(self, error: BaseException) -> None:
        raise AssertionError(f"a feed failed: {error}")

    def stop(self) -> None:
        pass

    def endpoint_due(self, sample: int | None) -> None:
        pass


def test_passes_start_a_pass_gap_apart_and_take_every_feed_that_came_due_meanwhile():
    from audiomask.asr.checkpoint import load_model
    from audiomask.asr.recognizer import StreamingRecognizer
    from audiomask.serve.engine import PASS_GAP_S, Engine
    from audiomask.serve.settings import ServeSettings

    feeds_count = 12
    starts: list[float] = []
    taken_counts: list[int] = []

    async def feed_one_after_another(recognizer: StreamingRecognizer) -> list:
        engine = Engine(ServeSettings(max_connections=feeds_count), recognizer)
        own_pass = engine._pass

        def spied_pass(recognizer, inbox, taken):
            starts.append(time.monotonic())
            taken_counts.append(len(taken))
            own_pass(recognizer, inbox, taken)

        engine._pass = spied_pass
        await engine.start()
        try:
            while engine.feed_limits is None:
                await asyncio.sleep(0.01)
            first_block = engine.feed_limits[0]
            feeds = [engine.attach(_Quiet(), f"caller-{index}") for index in range(feeds_count)]
            starts.clear(), taken_counts.clear()
            for feed in feeds:  # each feed comes due on its own, a millisecond after the one before
                await feed.put(np.zeros(first_block, np.float32))
                await asyncio.sleep(0.001)
            return [await engine.finish(feed) for feed in feeds]
        finally:
            await engine.stop()

    with StreamingRecognizer(load_model(), "cpu", max_streams=feeds_count) as recognizer:
        finals = asyncio.run(feed_one_after_another(recognizer))
    assert len(finals) == feeds_count  # every feed was fed and finished
    # Timed where the feeder thread starts each pass, a hand-over after the ticker's decision: give it slack.
    gaps = np.diff(starts)
    assert len(gaps) and gaps.min() >= PASS_GAP_S / 2 and np.median(gaps) >= PASS_GAP_S * 0.99, gaps
    assert sum(taken_counts) >= feeds_count and max(taken_counts) > 1  # a pass took the feeds due meanwhile
