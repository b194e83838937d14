import torch

from blockdraft.train.data import load_sequences, tokenize_chat
from blockdraft.train.shards import ShardWriter
from tests.conftest import tiny_tokenizer


def test_loss_mask_covers_assistant_turns_only():
    tok = tiny_tokenizer()
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo!"},
                {"role": "user", "content": "more"}, {"role": "assistant", "content": "ok"}]
    ids, mask = tokenize_chat(tok, messages, max_len=1000)
    supervised = tok.decode([t for t, m in zip(ids, mask) if m])
    assert supervised == "yo!<|im_end|>\nok<|im_end|>\n"
    assert tok.decode(ids) == ("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo!<|im_end|>\n"
                               "<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\nok<|im_end|>\n")
    short_ids, short_mask = tokenize_chat(tok, messages, max_len=10)
    assert short_ids == ids[:10] and short_mask == mask[:10]


def test_load_sequences_from_shards(tmp_path):
    tok = tiny_tokenizer()
    ShardWriter(tmp_path, "train", 2).add([
        {"id": "a", "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "answer"}]},
        {"id": "b", "messages": [{"role": "user", "content": "q2"}, {"role": "assistant", "content": ""}]},
        {"id": "c", "messages": [{"role": "user", "content": "q3"}, {"role": "assistant", "content": "x y"}]},
    ])
    seqs = load_sequences(tmp_path, "train", tok, max_len=64)
    assert [s.id for s in seqs] == ["a", "b", "c"]  # "b" still supervises its end-of-turn tokens
    assert all(s.input_ids.dtype == torch.long and s.loss_mask.dtype == torch.bool for s in seqs)
    assert len(load_sequences(tmp_path, "train", tok, max_len=64, limit=1)) == 1


def test_turns_the_template_renders_differently_are_left_unsupervised():
    tok = tiny_tokenizer()
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
                         "{% if m['role'] == 'assistant' and not loop.last %}[earlier]{% else %}{{ m['content'] }}"
                         "{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                         "{% endif %}")
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "first"},
                {"role": "user", "content": "b"}, {"role": "assistant", "content": "second"}]
    ids, mask = tokenize_chat(tok, messages, max_len=1000)
    assert tok.decode([t for t, m in zip(ids, mask) if m]) == "second<|im_end|>\n"
