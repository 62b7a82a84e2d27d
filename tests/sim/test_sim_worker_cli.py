"""`agent-cache sim-worker` serves SGLang's API with the flags it was given."""

from __future__ import annotations

import subprocess
import sys
import time

from agent_cache.backends import SGLangClient
from agent_cache.errors import BackendError


def test_sim_worker_command(free_port_factory) -> None:
    port = free_port_factory()
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent_cache.cli", "sim-worker", "--port", str(port), "--time-scale", "0",
         "--max-total-tokens", "5000", "--page-size", "4", "--radix-eviction-policy", "lfu",
         "--served-model-name", "tiny", "--no-enable-cache-report"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        client = SGLangClient(f"http://127.0.0.1:{port}", timeout=2)
        deadline = time.monotonic() + 30
        while True:
            try:
                client.health()
                break
            except BackendError:
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.1)
        info = client.server_info()
        assert (info["max_total_num_tokens"], info["page_size"], info["radix_eviction_policy"]) == (5000, 4, "lfu")
        assert info["enable_cache_report"] is False
        assert client.models()["data"][0]["id"] == "tiny"
    finally:
        proc.terminate()
        proc.wait(10)


def test_sim_worker_rejects_bad_flags() -> None:
    out = subprocess.run([sys.executable, "-m", "agent_cache.cli", "sim-worker", "--page-size", "0"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--page-size" in out.stderr


def test_sim_worker_names_a_bad_kv_events_config_before_it_starts() -> None:
    from agent_cache.cli import build_parser

    parser = build_parser()
    ok = parser.parse_args(["sim-worker", "--kv-events-config", '{"publisher": "zmq", "endpoint": "tcp://*:5557"}'])
    assert ok.kv_events_config == '{"publisher": "zmq", "endpoint": "tcp://*:5557"}'
    for bad, why in (('{"publisher": "kafka"}', "Unknown event publisher 'kafka'"), ('{"hwm": "x"}', "hwm:"),
                     ("{bad", "Invalid JSON")):
        out = subprocess.run([sys.executable, "-m", "agent_cache.cli", "sim-worker", "--kv-events-config", bad],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and "--kv-events-config" in out.stderr and why in out.stderr, out.stderr


def _word_model(folder) -> dict[str, int]:  # type: ignore[no-untyped-def]
    """A model folder whose tokenizer knows a few words and whose template marks each turn."""
    import json

    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "hello": 1, "world": 2, "again": 3}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<s>", "<|user|>", "<|assistant|>"])
    tok.save(str(folder / "tokenizer.json"))
    template = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
                "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "chat_template": template}))
    return {**vocab, **{t: tok.token_to_id(t) for t in ("<s>", "<|user|>", "<|assistant|>")}}


def test_sim_worker_counts_with_a_model_folders_tokenizer(tmp_path) -> None:
    from agent_cache.sim import SimWorkerThread, WorkerOptions

    ids = _word_model(tmp_path)
    worker = SimWorkerThread(WorkerOptions(time_scale=0, tokenizer_path=str(tmp_path)))
    worker.start()
    try:
        client = SGLangClient(worker.url, timeout=10)
        assert client.tokenize("hello world again")["tokens"] == [ids["hello"], ids["world"], ids["again"]]
        reply = client.chat([{"role": "user", "content": "hello world"}], max_tokens=2)
        # <s> <|user|> hello world <|assistant|>: the template's own tokens, no others added
        assert reply.usage.prompt_tokens == 5
    finally:
        worker.stop()


def test_sim_worker_names_a_bad_tokenizer_path(tmp_path) -> None:
    out = subprocess.run([sys.executable, "-m", "agent_cache.cli", "sim-worker", "--tokenizer-path", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--tokenizer-path" in out.stderr and "Traceback" not in out.stderr, out.stderr
