"""Draft trees from one drafter pass (DDTree: Ringel & Romano, 2026), and the walk that verifies them.

The drafter proposes every slot of a block in one forward; its distributions q_1..q_L over the slots are
treated as independent, and the tree holds the N prefixes with the largest product of slot probabilities.
They are found best-first: a max-heap of candidate nodes (parent, depth d, rank r: the r-th most likely token
of slot d), scored by the log-probability of their path. Popping the best makes it a node and pushes its next
sibling (same parent, rank r + 1) and its first child (depth d + 1, rank 0 under it). Every node is popped
after its parent, so nodes come out parents first and the first n nodes of a tree are the best n-node tree
for every n (the policy prices prefixes). Under the factorised q, a node is reached (its whole path
accepted) with its path probability, so the expected number of accepted drafts of a tree is the sum of its
nodes' path probabilities.

A looked-up continuation (`blockdraft.decoding.lookup`) joins as one branch: its tokens are the first nodes,
a chain under the root, and the drafter's best-first nodes fill the rest of the budget (a drafter node equal
to a looked-up one is the same node, and its children grow under it).

Layout. The target verifies [root, node 1, ..., node N] in one forward: row 0 is the last committed token
(the root, depth 0), row i is node i at position start + depth, attending to the cache and to its
ancestors only (`ancestors`). The walk starts at the root and, at each row, takes the target's token there
(its argmax, or its draw from that row's distribution): when a child of the row carries that token the walk
moves to it (an accepted draft), else that token is the bonus and the walk ends. The committed tokens are
exactly the tokens plain decoding picks from the same distributions, so the walk is lossless at every
temperature (it never uses min(1, p/q), which is biased on a top-k tree).
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Callable

import torch

from blockdraft.errors import InvalidArgumentError


@dataclass
class DraftTree:
    """N draft nodes under the root; row i (1..N) is node i, row 0 the root."""

    tokens: torch.Tensor    # (N,) long: node i's token is tokens[i - 1]
    parents: list[int]      # parents[i - 1]: the row of node i's parent (0: the root), always < i
    depths: list[int]       # depths[i - 1]: 1 + its parent's depth
    probs: list[float]      # the drafter's probability of node i's token at its slot (1.0 for looked-up nodes)
    lookup: int = 0         # nodes 1..lookup are a looked-up branch (a chain under the root)

    def __len__(self) -> int:
        return len(self.parents)

    @property
    def depth(self) -> int:
        return max(self.depths, default=0)

    def prefix(self, n: int) -> "DraftTree":
        """The first n nodes: a tree itself, since parents come before children."""
        return DraftTree(self.tokens[:n], self.parents[:n], self.depths[:n], self.probs[:n], min(self.lookup, n))

    def children(self) -> list[dict[int, int]]:
        """Per row (0..N): {token: child row}."""
        kids: list[dict[int, int]] = [{} for _ in range(len(self) + 1)]
        for i, (parent, token) in enumerate(zip(self.parents, self.tokens.tolist()), 1):
            kids[parent][token] = i
        return kids

    def is_chain(self) -> bool:
        """Whether node i's parent is node i - 1 for every i (a chain of drafts, verified as usual)."""
        return all(p == i for i, p in enumerate(self.parents))

    def ancestors(self) -> torch.Tensor:
        """(N + 1, N + 1) bool: [i, j] iff row j is row i or one of its ancestors (the rows row i attends to)."""
        n = len(self)
        seen = torch.eye(n + 1, dtype=torch.bool)
        for i, parent in enumerate(self.parents, 1):
            seen[i] |= seen[parent]
        return seen

    def positions(self) -> list[int]:
        """Depth of every row (root 0): row i sits at position start + positions()[i]."""
        return [0, *self.depths]


def best_first(log_probs: torch.Tensor, ids: torch.Tensor, budget: int,
               lookup: list[int] | tuple[int, ...] = ()) -> DraftTree:
    """The best `budget`-node tree under the slots' marginals (best-first over a heap, see the module).

    log_probs (L, k): each slot's k largest log-probabilities, descending; ids (L, k): their tokens. A
    non-empty `lookup` is a looked-up continuation: the first nodes, a chain under the root (cut to the
    budget); the drafter's nodes fill the rest. Runs on the host (a few hundred floats at most)."""
    if not isinstance(budget, int) or budget < 0:
        raise InvalidArgumentError(f"tree budget={budget!r}: expected an integer >= 0")
    if log_probs.shape != ids.shape or log_probs.dim() != 2:
        raise InvalidArgumentError(f"log_probs {tuple(log_probs.shape)} and ids {tuple(ids.shape)}: expected the "
                                   "same (slots, k) shape")
    lookup = list(lookup)[:budget]
    slots, k = ids.shape
    lp, tok = log_probs.double().tolist(), ids.tolist()
    parents, depths, tokens = list(range(len(lookup))), list(range(1, len(lookup) + 1)), list(lookup)
    probs = [1.0] * len(lookup)
    row_of = {(i, t): i + 1 for i, t in enumerate(lookup)}  # (parent row, token) -> row
    heap: list[tuple[float, int, int, int, int]] = []  # (-score, tie, parent row, depth, rank)
    if slots and k:
        heap.append((-lp[0][0], 0, 0, 1, 0))
    pushed = 1
    while heap and len(tokens) < budget:
        neg, _, parent, depth, rank = heapq.heappop(heap)
        if neg == math.inf:  # only tokens the drafter rules out are left
            break
        token = tok[depth - 1][rank]
        row = row_of.get((parent, token))
        if row is None:  # a new node (else the looked-up node with this token: its children grow under it)
            tokens.append(token)
            parents.append(parent)
            depths.append(depth)
            probs.append(math.exp(lp[depth - 1][rank]))
            row = row_of[(parent, token)] = len(tokens)
        if rank + 1 < k:  # next sibling
            heapq.heappush(heap, (neg + lp[depth - 1][rank] - lp[depth - 1][rank + 1], pushed, parent, depth, rank + 1))
            pushed += 1
        if depth < slots:  # first child
            heapq.heappush(heap, (neg - lp[depth][0], pushed, row, depth + 1, 0))
            pushed += 1
    device = ids.device
    return DraftTree(torch.tensor(tokens, dtype=torch.long, device=device), parents, depths, probs, len(lookup))


def slot_candidates(probs: torch.Tensor, k: int, noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Each slot's k best tokens for a tree, from the drafter's distributions probs (L, V): (log-probabilities
    (L, k) descending, indices (L, k)).

    With `noise` (L, V), the gumbel sampler's exponential noise of the slots' positions, the slots are ranked
    by the race q(x) / E(x) that the target's draw there also runs (`blockdraft.decoding.gumbel`), and scored
    by its normalised form r(x) = (q(x) / E(x)) / sum_y q(y) / E(y): the race's winner under q comes first, so
    the tree aims at the target's actual draw."""
    scores = probs.double() if noise is None else probs.double() / noise
    top, idx = torch.topk(scores, min(k, scores.shape[-1]), dim=-1)
    return (top / scores.sum(-1, keepdim=True)).log(), idx


def walk(tree: DraftTree, choose: Callable[[int], int]) -> tuple[list[int], int]:
    """Follow the target's tokens from the root: `choose(row)` is the target's token at row `row` (its argmax,
    or its draw there). Returns (the accepted rows, root excluded, in order; the bonus token)."""
    kids = tree.children()
    path, row = [], 0
    while True:
        token = choose(row)
        child = kids[row].get(token)
        if child is None:
            return path, token
        path.append(child)
        row = child


def tested(tree: DraftTree, path: list[int]) -> list[tuple[int, bool]]:
    """The nodes a walk along `path` tested, each with whether it was accepted: the children of the root and of
    every accepted row (the policy calibrates its acceptance estimates on them)."""
    on_path = set(path)
    reached = {0, *path}
    return [(i, i in on_path) for i, parent in enumerate(tree.parents, 1) if parent in reached]
