"""Prompt-lookup drafts: continue the context from the latest earlier place where its last n tokens occurred.

Small instruction-tuned targets repeat themselves: a list's item template, code identifiers, and, at T = 0,
whole loops. Simulated on the default target's 105 held-out greedy answers (`data/regenerated`), chains of
up to 15 looked-up tokens commit 8.0 tokens per verify after a 3-token match, 3.6 after a 2-token match
and 1.8 after a 1-token match, against ~1.6 for the shipped DFlash drafter. The engine uses these drafts
next to the drafter's (`DecodeOptions(ngram=True)`): they cost no drafter forward, and the adaptive
policy learns how often each match length is right and plans a batch's lookups together
(`AdaptiveVerify.ngram_rate`, `AdaptiveVerify.ngram_lengths`).

Lossless like any draft: a lookup is a function of the committed tokens only, so verifying it as a
deterministic proposal (q = one-hot) keeps greedy output and the sampled distribution exactly the target's.
"""
from __future__ import annotations

MAX_MATCH = 3  # longest suffix looked up
MIN_MATCH = 1


class NgramIndex:
    """The committed tokens of one request, with the latest continued occurrence of each 1..MAX_MATCH-gram.

    `follow[g] = e` means tokens[e - len(g):e] == g and tokens[e] exists: the latest such place, so a lookup
    of the current suffix never finds the suffix itself (it has no continuation yet).
    """

    def __init__(self, tokens: list[int], max_match: int = MAX_MATCH, min_match: int = MIN_MATCH) -> None:
        self.tokens: list[int] = []
        self.max_match, self.min_match = max_match, min_match
        self.follow: dict[tuple[int, ...], int] = {}
        self.extend(tokens)

    def extend(self, tokens: list[int]) -> None:
        for t in tokens:
            end = len(self.tokens)  # the n-grams ending here are now continued by t
            for n in range(self.min_match, min(self.max_match, end) + 1):
                self.follow[tuple(self.tokens[end - n:end])] = end
            self.tokens.append(t)

    def lookup(self, limit: int) -> tuple[list[int], int]:
        """(up to `limit` drafts continuing the longest matched suffix, its length); ([], 0) without a match.

        A continuation that runs into the present repeats itself (a loop of period p predicts its next p
        tokens, then the p after them, ...)."""
        toks, size = self.tokens, len(self.tokens)
        for n in range(min(self.max_match, size), self.min_match - 1, -1):
            end = self.follow.get(tuple(toks[size - n:]))
            if end is not None:
                drafts: list[int] = []
                for i in range(limit):
                    j = end + i
                    drafts.append(toks[j] if j < size else drafts[j - size])
                return drafts, n
        return [], 0
