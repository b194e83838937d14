from blockdraft.decoding.lookup import NgramIndex


def test_the_longest_suffix_match_is_continued_from_its_latest_place():
    idx = NgramIndex([5, 1, 2, 8, 1, 2, 9, 3, 1, 2])
    assert idx.lookup(2) == ([9, 3], 2)  # (1, 2) last continued at position 6, not 3
    idx = NgramIndex([7, 1, 2, 4, 6, 1, 2])
    assert idx.lookup(3) == ([4, 6, 1], 2)
    assert NgramIndex([4, 5, 6]).lookup(3) == ([], 0)  # nothing repeats
    idx = NgramIndex([4, 5, 6, 4, 9, 6])
    assert idx.lookup(2) == ([4, 9], 1)  # only the last token matches


def test_the_suffix_itself_is_never_its_own_match_and_loops_repeat():
    idx = NgramIndex([1, 2, 3, 1, 2, 3])
    assert idx.lookup(7) == ([1, 2, 3, 1, 2, 3, 1], 3)  # a loop of period 3 continues itself
    assert NgramIndex([6, 6]).lookup(4) == ([6, 6, 6, 6], 1)


def test_extending_step_by_step_equals_indexing_at_once():
    tokens = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4, 3, 3, 8, 3, 2, 7]
    step = NgramIndex(tokens[:3])
    for i in range(3, len(tokens)):
        step.extend(tokens[i:i + 1])
        assert step.lookup(5) == NgramIndex(tokens[:i + 1]).lookup(5)
