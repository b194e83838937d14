"""Local `.gguf` targets: converted once, cached, and the same model as the weights they were written from."""
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from blockdraft.errors import CheckpointError
from blockdraft.modeling import gguf
from blockdraft.modeling.registry import load_target, resolve_target
from tests.conftest import tiny_hf_model, tiny_tokenizer

# Hugging Face Qwen2 parameter names -> llama.cpp's GGUF tensor names (gguf-py's tensor map, read backwards)
LAYER = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
         "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
         "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def gguf_name(name: str) -> str:
    if name.startswith("model.layers."):
        _, _, i, rest = name.split(".", 3)
        module, kind = rest.rsplit(".", 1)
        return f"blk.{i}.{LAYER[module]}.{kind}"
    return {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
            "lm_head.weight": "output.weight"}[name]


def write_gguf(path, model, tokenizer, arch: str = "qwen2") -> None:
    """A float32 GGUF of a Hugging Face Qwen2 model, written the way llama.cpp's converter lays one out."""
    import gguf as gg

    cfg = model.config
    w = gg.GGUFWriter(str(path), arch)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    special = set(tokenizer.all_special_tokens)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list([t for t, _ in vocab])
    w.add_token_types([3 if t in special else 1 for t, _ in vocab])
    w.add_token_scores([0.0] * len(vocab))  # no merges: a byte-level vocabulary; merges are derived from scores
    w.add_eos_token_id(tokenizer.eos_token_id)
    w.add_chat_template(tokenizer.chat_template)
    for name, tensor in model.state_dict().items():
        w.add_tensor(gguf_name(name), tensor.detach().to(torch.float32).numpy().astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture
def qwen2_gguf(tmp_path, monkeypatch):
    monkeypatch.setenv("BLOCKDRAFT_HOME", str(tmp_path / "home"))
    tok = tiny_tokenizer()
    model = tiny_hf_model("qwen2", vocab=len(tok), dtype=torch.float32, head_scale=4.0)
    path = tmp_path / "tiny-qwen2.F32.gguf"
    write_gguf(path, model, tok)
    return path, model


def test_a_qwen2_gguf_target_is_the_model_it_was_written_from(qwen2_gguf):
    path, model = qwen2_gguf
    assert gguf.gguf_architecture(path) == "qwen2"
    target = load_target(str(path), device="cpu", dtype="float32")
    ids = torch.tensor([[5, 17, 42, 99, 3, 250]])
    with torch.no_grad():
        expected = model(ids).logits
        got = target.model(ids).logits
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert target.tokenizer.decode(target.tokenizer.encode("hi there")) == "hi there"


def test_a_gguf_target_converts_once(qwen2_gguf, monkeypatch):
    path, _ = qwen2_gguf
    folder = resolve_target(str(path))
    assert (Path(folder) / gguf.MARKER).is_file() and Path(folder).parent == Path(os.environ["BLOCKDRAFT_HOME"]) / "targets"

    def refuse(*_a, **_k):
        raise AssertionError("converted again")

    monkeypatch.setattr(gguf, "convert_gguf", refuse)
    assert resolve_target(str(path)) == folder


def test_other_gguf_architectures_and_broken_files_get_one_line_errors(tmp_path, monkeypatch):
    import gguf as gg

    monkeypatch.setenv("BLOCKDRAFT_HOME", str(tmp_path / "home"))
    other = tmp_path / "gemma.gguf"
    w = gg.GGUFWriter(str(other), "gemma2")
    w.add_block_count(1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(CheckpointError, match=r"GGUF architecture 'gemma2', expected one of llama, qwen2, qwen3"):
        resolve_target(str(other))
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a gguf file at all")
    with pytest.raises(CheckpointError, match="not a readable GGUF file"):
        resolve_target(str(broken))
