import torch

from blockdraft.train.blocks import (
    IGNORE,
    anchor_candidates,
    block_mask,
    build_blocks,
    dense_mask_fn,
    grouped_mask_fn,
    sample_anchors,
)

MASK = 99


def test_anchor_candidates_need_this_and_next_token_supervised():
    lm = torch.tensor([0, 0, 1, 1, 1, 0, 1, 1, 0, 1])
    assert anchor_candidates(lm).tolist() == [2, 3, 6]


def test_sample_anchors_is_bounded_sorted_and_seeded():
    lm = torch.ones(100, dtype=torch.bool)
    a = sample_anchors(lm, 10, torch.Generator().manual_seed(1))
    b = sample_anchors(lm, 10, torch.Generator().manual_seed(1))
    c = sample_anchors(lm, 10, torch.Generator().manual_seed(2))
    assert a.tolist() == b.tolist() != c.tolist()
    assert a.numel() == 10 and a.tolist() == sorted(set(a.tolist())) and a.max() < 99


def test_mask_is_strict_against_the_anchor_and_bidirectional_inside_blocks():
    # Overlapping anchors 3 and 4 (dense): blocks share positions 4..6 but must stay apart.
    mask = block_mask(torch.tensor([[3, 4]]), block_size=4, context_len=10)[0, 0]
    assert mask.shape == (8, 10 + 8)
    ctx, blocks = mask[:, :10], mask[:, 10:]
    for q in range(4):  # block 0, anchor 3: context 0..2 only (not 3 itself)
        assert ctx[q].tolist() == [True] * 3 + [False] * 7
    for q in range(4, 8):  # block 1, anchor 4: context 0..3
        assert ctx[q].tolist() == [True] * 4 + [False] * 6
    expected = torch.zeros(8, 8, dtype=torch.bool)
    expected[:4, :4] = True
    expected[4:, 4:] = True
    assert torch.equal(blocks, expected)  # all of its own block (both ways), nothing of the other


def test_labels_are_same_position_with_anchor_and_unsupervised_dropped():
    tokens = torch.tensor([10, 11, 12, 13, 14, 15, 16])
    lm = torch.tensor([0, 1, 1, 1, 0, 1, 1]).bool()
    b = build_blocks([tokens], [lm], [torch.tensor([1, 5])], block_size=4, mask_token_id=MASK, context_len=7)
    assert b.input_ids.tolist() == [[11, MASK, MASK, MASK, 15, MASK, MASK, MASK]]
    assert b.positions.tolist() == [[1, 2, 3, 4, 5, 6, 7, 8]]
    # block at 1: slot k -> token at 1 + k (12, 13), 14 is unsupervised; block at 5: 16, then past the end
    assert b.labels.tolist() == [[IGNORE, 12, 13, IGNORE, IGNORE, 16, IGNORE, IGNORE]]


def test_padding_slots_of_shorter_sequences_are_ignored():
    t1, t2 = torch.arange(10), torch.arange(20, 26)
    b = build_blocks([t1, t2], [torch.ones(10, dtype=torch.bool), torch.ones(6, dtype=torch.bool)],
                     [torch.tensor([1, 4, 6]), torch.tensor([2])], block_size=3, mask_token_id=MASK, context_len=10)
    assert b.valid.tolist() == [[True, True, True], [True, False, False]]
    assert b.labels[1].tolist() == [IGNORE, 23, 24] + [IGNORE] * 6
    assert block_mask(b.anchors, b.block_size, 10).shape == (2, 1, 9, 19)


def test_target_labels_follow_the_target_only_while_the_text_agrees_with_it():
    tokens = torch.tensor([10, 11, 12, 13, 14, 15, 16, 17])
    lm = torch.ones(8, dtype=torch.bool)
    anchors = [torch.tensor([1, 3])]
    own = torch.cat([tokens[1:], torch.tensor([18])])  # the text is the target's own greedy answer
    data = build_blocks([tokens], [lm], anchors, 4, MASK, 8)
    target = build_blocks([tokens], [lm], anchors, 4, MASK, 8, greedy=[own])
    assert torch.equal(data.labels, target.labels)
    # the target would write 50 after 12 (the text has 13), and 51 after 14 (the text has 15)
    greedy = own.clone()
    greedy[2], greedy[4] = 50, 51
    b = build_blocks([tokens], [lm], anchors, 4, MASK, 8, greedy=[greedy])
    # block at 1: slot 1 -> 12 (agrees), slot 2 -> 50 (the target's choice), slot 3 dropped (the text left
    # the target's path at slot 2); block at 3: slot 1 -> 14, slot 2 -> 51, slot 3 dropped
    assert b.labels.tolist() == [[IGNORE, 12, 50, IGNORE, IGNORE, 14, 51, IGNORE]]


def test_grouped_masks_keep_each_runs_visible_keys_only():
    seqs = [torch.arange(30), torch.arange(12)]
    anchors = [torch.tensor([2, 9, 17, 25]), torch.tensor([1, 6])]  # the second row pads slots 2, 3 (anchor 0)
    blocks = build_blocks(seqs, [torch.ones(30), torch.ones(12)], anchors, 3, 99, 30)
    dense = dense_mask_fn(blocks, 30, torch.device("cpu"))(False, None)  # (2, 1, 12, 30 + 12)
    grouped = grouped_mask_fn(blocks, 30, torch.device("cpu"), groups=3)(False, None)
    assert [(q.start, q.stop, c) for q, c, _ in grouped.groups] == [(0, 3, 2), (3, 9, 17), (9, 12, 25)]
    for q, c, m in grouped.groups:
        assert m.shape == (2, 1, q.stop - q.start, c + q.stop - q.start)
        assert torch.equal(m, torch.cat([dense[:, :, q, :c], dense[:, :, q, 30 + q.start:30 + q.stop]], dim=-1))
        left_out = dense[:, :, q].clone()
        left_out[..., :c] = False
        left_out[..., 30 + q.start:30 + q.stop] = False
        assert not left_out.any()  # every key a group leaves out is hidden from all its queries
