"""What putting a hybrid target's linear-attention states back costs per cycle (docs/hybrid.md).

Random Qwen3.5 targets (a tiny one and a Qwen3.5-0.8B-shaped one), prepacked on CPU as `blockdraft` runs them,
after a 256-token prompt: a verify of T tokens, then the cache back to the tokens that stay (n of the T), by

- recompute: what blockdraft does (`blockdraft.modeling.recurrent`): the recorded convolution inputs of the n
           tokens give their queries, keys and values again, the gate projections (hidden x heads) their gates,
           and the gated delta rule runs n steps from the recurrent state copied as the verify reached the layer;
- rerun:   restore the states from before the verify and run each linear-attention layer alone again over its
           kept inputs of the n tokens (all of its projections: about half of a Qwen3.5-0.8B layer's weights);
- forward: restore the states from before the verify and run the n tokens through the whole model again;
- keep-all (a lower bound for keeping every position's state during the verify and picking the accepted one):
           only the copies of T recurrent and convolution states per linear-attention layer, not the kernel
           that would have to write them.

Times are medians over rounds that alternate the methods. Usage: python scripts/rollback_cost.py [--rounds 7]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from blockdraft.modeling.target import TargetModel

SHAPES = {
    "tiny (4 layers, hidden 32)": dict(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                       linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2,
                                       linear_num_value_heads=4),
    "Qwen3.5-0.8B-shaped (24 layers, hidden 1024)": dict(
        vocab_size=248320, hidden_size=1024, intermediate_size=3584, num_hidden_layers=24, num_attention_heads=8,
        num_key_value_heads=2, head_dim=256, linear_key_head_dim=128, linear_value_head_dim=128,
        linear_num_key_heads=16, linear_num_value_heads=16, tie_word_embeddings=True),
}
METHODS = ("recompute", "rerun", "forward", "keep-all")
PROMPT, CASES = 256, ((16, 1), (16, 8), (4, 1), (4, 3))  # (verified tokens T, tokens that stay n)


def build(shape: dict) -> TargetModel:
    import transformers as tf

    layers = shape["num_hidden_layers"]
    kinds = ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(layers)]
    config = tf.Qwen3_5TextConfig(**shape, layer_types=kinds, max_position_embeddings=4096,
                                  bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    target = TargetModel(tf.Qwen3_5ForCausalLM(config).float().eval())
    target.pack()
    target.set_feature_layers([1, layers - 1])
    return target


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


@torch.inference_mode()
def rerun(target: TargetModel, cache, length: int) -> None:
    """The alternative: states from before the verify, then each linear-attention layer over its kept inputs."""
    rollback, keep = target.states, length - cache.start
    rollback._crop_attention(cache, cache.get_seq_length() - length)
    for i in rollback.layer_ids:
        layer, kept = cache.layers[i], cache.kept[i]
        layer.conv_states[0] = layer.conv_states[0][..., :kept.conv_before]
        layer.recurrent_states[0].copy_(kept.recurrent)
        rollback.mixers[i](hidden_states=kept.inputs[:, :keep], cache=cache)


def one_round(target: TargetModel, cache, verify: int, keep: int) -> dict[str, float]:
    ids = torch.randint(0, target.vocab_size, (1, verify))
    out = {}
    for method in METHODS:
        out["verify"] = timed(lambda: target.forward(ids, cache, PROMPT))
        if method == "recompute":
            out[method] = timed(lambda: target.rollback(cache, PROMPT + keep))
        elif method == "rerun":
            out[method] = timed(lambda: rerun(target, cache, PROMPT + keep))
        elif method == "forward":
            out[method] = timed(lambda: (target.rollback(cache, PROMPT),
                                         target.forward(ids[:, :keep], cache, PROMPT, features=True)))
        else:
            states = [t for layer in cache.layers if hasattr(layer, "recurrent_states")
                      for t in (layer.conv_states[0], layer.recurrent_states[0])]
            out[method] = timed(lambda: [t.clone() for t in states for _ in range(verify)])
        target.rollback(cache, PROMPT)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32 on CPU, prompt {PROMPT} tokens")
    print("| shape | T verified | n kept | verify forward | recompute (ours) | rerun | forward | keep-all (lower bound) |")
    print("|---|---|---|---|---|---|---|---|")
    for name, shape in SHAPES.items():
        target = build(shape)
        cache = target.new_cache()
        target.forward(torch.randint(0, target.vocab_size, (1, PROMPT)), cache, 0, features=False, last_only=True)
        for verify, keep in CASES:
            one_round(target, cache, verify, keep)  # warm-up
            rounds = [one_round(target, cache, verify, keep) for _ in range(args.rounds)]
            ms = {k: 1000 * statistics.median(r[k] for r in rounds) for k in rounds[0]}

            def cell(method: str) -> str:
                return f"{ms[method]:.2f} ms ({ms[method] / (ms['verify'] + ms[method]):.1%})"

            print(f"| {name} | {verify} | {keep} | {ms['verify']:.2f} ms | "
                  + " | ".join(cell(m) for m in METHODS) + " |", flush=True)


if __name__ == "__main__":
    main()
