"""Training on a sub-vocabulary: the drafter's cross-entropy over the tokens the data uses.

Scoring all V tokens of the target's LM head is most of a CPU training step (for SmolLM2, 49,152 rows
against ~10K distinct tokens in 330K regenerated response tokens). `TrainVocab` scores only the tokens
that appear as labels in the training data, plus `negatives` others drawn afresh every step (a function of
(seed, step), so a resumed run draws the same ones), which keeps the rest of the vocabulary pushed down.
Labels outside the sub-vocabulary are dropped from the loss; target labels (`--labels target`), which are
known only once the target has run, join the rows of their step. The drafter itself is unchanged: at
inference it scores the whole vocabulary, or its own draft vocabulary (`blockdraft.modeling.draft_vocab`), and the
engine's acceptance measures the result.
"""
from __future__ import annotations

import torch

from blockdraft.errors import InvalidArgumentError
from blockdraft.train.blocks import IGNORE
from blockdraft.train.data import Sequence


class TrainVocab:
    def __init__(self, sequences: list[Sequence], vocab_size: int, negatives: int, seed: int) -> None:
        if negatives < 0:
            raise InvalidArgumentError(f"vocab negatives={negatives}: expected >= 0")
        seen = torch.zeros(vocab_size, dtype=torch.bool)
        for s in sequences:
            seen[s.input_ids[s.loss_mask.bool()]] = True
        self.core = seen.nonzero()[:, 0]          # (V_data,) label tokens, sorted
        self.rest = (~seen).nonzero()[:, 0]       # (V - V_data,)
        self.negatives = min(negatives, self.rest.numel())
        self.vocab_size, self.seed = vocab_size, seed

    def rows(self, step: int, extra: torch.Tensor | None = None) -> torch.Tensor:
        """(V',) vocabulary ids scored at `step`: the data's tokens first, then this step's negatives, then
        any of the `extra` ids (this step's target labels) not among them yet."""
        rows = self.core
        if self.negatives:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
            rows = torch.cat([rows, self.rest[torch.randperm(self.rest.numel(), generator=g)[: self.negatives]]])
        if extra is not None:
            present = torch.zeros(self.vocab_size, dtype=torch.bool)
            present[rows] = True
            extra = extra.flatten().cpu().unique()
            rows = torch.cat([rows, extra[~present[extra]]])
        return rows

    def remap(self, labels: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Labels as indices into `rows` (IGNORE stays IGNORE; tokens not in `rows` become IGNORE)."""
        lookup = torch.full((self.vocab_size,), IGNORE, dtype=torch.long, device=labels.device)
        lookup[rows.to(labels.device)] = torch.arange(rows.numel(), device=labels.device)
        return torch.where(labels == IGNORE, IGNORE, lookup[labels.clamp_min(0)])
