"""Two processes on 127.0.0.1 (2 simulated CPU devices each, gloo collectives) serve one
4-way model: the same greedy ids as one device; killing process 1 ends process 0 non-zero."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest

from tests.paged import PagedDriver
from tgix import testing
from tgix.models import load_model

HEARTBEAT_S = 3
START_TIMEOUT_S = 240


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port: int, route: str, body: dict):
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{route}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.fixture
def group(tiny_checkpoints, tmp_path):
    """Process 0 (HTTP on `port`) and process 1 of one 4-way model; both killed at the end."""
    coordinator, port = free_port(), free_port()
    env = dict(
        os.environ,
        JAX_PLATFORMS="cpu",
        XLA_FLAGS="--xla_force_host_platform_device_count=2",
        TGIX_CACHE=str(tmp_path / "cache"),
        TGIX_HEARTBEAT_TIMEOUT=str(HEARTBEAT_S),
    )
    common = [
        sys.executable,
        "-m",
        "tgix.serve",
        "--model-id",
        str(tiny_checkpoints("llama")),
        "--num-shard",
        "4",
        "--coordinator-address",
        f"127.0.0.1:{coordinator}",
        "--num-processes",
        "2",
        "--max-input-tokens",
        "24",
        "--max-total-tokens",
        "40",
        "--max-batch-prefill-tokens",
        "32",
        "--max-batch-total-tokens",
        "256",
        "--max-batch-size",
        "2",
        "--disable-grammar-support",
    ]
    procs = []
    for pid in (1, 0):
        log = open(tmp_path / f"process{pid}.log", "wb")  # noqa: SIM115
        args = [*common, "--process-id", str(pid), "--port", str(port)]
        procs.append(subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT))
    follower, leader = procs
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not healthy(port):
            if leader.poll() is not None or follower.poll() is not None:
                pytest.fail((tmp_path / "process0.log").read_text()[-3000:])
            assert time.monotonic() < deadline, "the group did not become healthy"
            time.sleep(0.5)
        yield leader, follower, port
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(30)


def one_device_greedy(path, prompt_ids, n):
    """Greedy ids from the forward on one device, over the tokenizer's part of V."""
    loaded = load_model(str(path))
    driver = PagedDriver(loaded.model, loaded.config, loaded.mesh, num_pages=16)
    ids, feed = [], list(prompt_ids)
    for _ in range(n):
        logits = driver.step({"r": feed})["r"][: testing.TOKENIZER_VOCAB_SIZE]
        feed = [int(np.argmax(logits))]
        ids += feed
    return ids


def test_two_processes_serve_one_model_and_fail_together(group, tiny_checkpoints):
    leader, follower, port = group
    prompt = "the quick brown fox"
    prompt_ids = [t["id"] for t in post(port, "/tokenize", {"inputs": prompt})]
    body = {"inputs": prompt, "parameters": {"max_new_tokens": 8, "details": True}}
    for _ in range(2):  # twice: pages freed and reused across the group
        answer = post(port, "/generate", body)
        ids = [t["id"] for t in answer["details"]["tokens"]]
        assert ids == one_device_greedy(tiny_checkpoints("llama"), prompt_ids, 8)
    follower.send_signal(signal.SIGKILL)
    start = time.monotonic()
    code = leader.wait(timeout=HEARTBEAT_S * 10)
    assert code != 0
    assert time.monotonic() - start < HEARTBEAT_S * 10
