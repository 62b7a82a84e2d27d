"""Writes a tiny Llama with random weights and a locally trained byte-level BPE tokenizer into a folder.

Run by the harness inside a set-up SGLang environment (it needs torch, tokenizers and safetensors, which
the project's own environment does not carry): ``python tiny_model.py OUT_DIR``. Nothing is downloaded.
The files are written by hand rather than by ``save_pretrained`` so that every transformers release the
harness sets up reads them (4.57 cannot read a tokenizer saved by transformers 5).
"""

from __future__ import annotations

import json
import sys
import sysconfig
from pathlib import Path

VOCAB_SIZE = 4096
SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% elif message['content'] %}{% for part in message['content'] %}{% if part['type'] == 'text' %}"
    "{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{% if message.get('tool_calls') %}{% for call in message['tool_calls'] %}"
    "<tool_call>{{ call['function'] | tojson }}</tool_call>{% endfor %}{% endif %}"
    "<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": VOCAB_SIZE,
}


def _corpus() -> list[str]:
    """The standard library's own sources: on every machine with this Python, the same text."""
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:300]
    return [f.read_text(encoding="utf-8", errors="replace") for f in files]


def write_tokenizer(out: Path) -> dict[str, int]:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(), trainer=trainer)
    tok.save(str(out / "tokenizer.json"))
    ids = {name: tok.token_to_id(name) for name in SPECIAL}
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": SPECIAL[0], "eos_token": "<|eot_id|>",
        "pad_token": SPECIAL[1], "add_bos_token": False, "model_max_length": CONFIG["max_position_embeddings"],
        "clean_up_tokenization_spaces": False, "chat_template": CHAT_TEMPLATE}, indent=1))
    (out / "special_tokens_map.json").write_text(json.dumps({
        "bos_token": SPECIAL[0], "eos_token": "<|eot_id|>", "pad_token": SPECIAL[1]}))
    return ids


def write_weights(out: Path) -> None:
    import torch
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(0)
    h, inter, kv = CONFIG["hidden_size"], CONFIG["intermediate_size"], CONFIG["num_key_value_heads"]
    kv_dim = kv * CONFIG["head_dim"]

    def rand(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * 0.02).to(torch.bfloat16)

    tensors = {"model.embed_tokens.weight": rand(VOCAB_SIZE, h), "lm_head.weight": rand(VOCAB_SIZE, h),
               "model.norm.weight": torch.ones(h, dtype=torch.bfloat16)}
    for i in range(CONFIG["num_hidden_layers"]):
        p = f"model.layers.{i}."
        tensors.update({
            p + "self_attn.q_proj.weight": rand(h, h), p + "self_attn.k_proj.weight": rand(kv_dim, h),
            p + "self_attn.v_proj.weight": rand(kv_dim, h), p + "self_attn.o_proj.weight": rand(h, h),
            p + "mlp.gate_proj.weight": rand(inter, h), p + "mlp.up_proj.weight": rand(inter, h),
            p + "mlp.down_proj.weight": rand(h, inter),
            p + "input_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
            p + "post_attention_layernorm.weight": torch.ones(h, dtype=torch.bfloat16)})
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})


def main(out_dir: str) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ids = write_tokenizer(out)
    config = {**CONFIG, "bos_token_id": ids[SPECIAL[0]], "eos_token_id": ids["<|eot_id|>"],
              "pad_token_id": ids[SPECIAL[1]]}
    (out / "config.json").write_text(json.dumps(config, indent=1))
    (out / "generation_config.json").write_text(json.dumps({
        "bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}))
    write_weights(out)


if __name__ == "__main__":
    main(sys.argv[1])
