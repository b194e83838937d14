"""The DFlash decode loop: prefill, then per cycle one draft forward and one target verify forward.

    prefill target on the prompt (capturing features); first token from its logits
    loop: block = [last token, MASK x n] -> drafter (one forward) -> n drafts
          target verifies [last token, drafts] (one forward) -> accept a drafts + 1 bonus token
          roll the target cache back to the committed length; only committed tokens' features go on
          to the drafter's context cache.
`no_draft` runs plain autoregressive decoding through the same target: the baseline for comparisons.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterator

import torch

from blockdraft.decoding.acceptance import accepted_prefix, greedy_verify, one_hot, speculative_verify
from blockdraft.decoding.adaptive import AdaptiveVerify
from blockdraft.decoding.costs import cached_cost_curve
from blockdraft.decoding.gumbel import new_seed, race_choice, race_noise
from blockdraft.decoding.lookup import NgramIndex
from blockdraft.decoding.sampling import SamplingParams, new_generator, probabilities, sample_index, uniforms
from blockdraft.decoding.stats import GenerationStats, now
from blockdraft.decoding.tree import DraftTree, best_first, slot_candidates, walk
from blockdraft.errors import IncompatibleModelsError, InvalidArgumentError
from blockdraft.modeling.draft_vocab import draft_head
from blockdraft.modeling.drafter import DraftCache, Drafter
from blockdraft.modeling.fast_target import FastTarget
from blockdraft.modeling.pair import pair_problems
from blockdraft.modeling.target import TargetModel

VERIFY_MODES = ("fixed", "adaptive")
TREE_MODES = ("off", "auto")
TREE_BUDGET = 32  # nodes of a tree="auto" tree (the adaptive policy verifies the prefix that pays)
TREE_EXPECTED = "expected 'off', 'auto' or a node budget >= 1"


@dataclass
class DecodeState:
    """The decoding state of one request."""

    prompt: list[int]
    options: "DecodeOptions"
    stats: GenerationStats
    block: int                              # run-time block size (1: plain decoding)
    gen: torch.Generator | None             # the rejection sampler's uniforms (None: greedy or gumbel)
    draft_cache: DraftCache | None
    policy: AdaptiveVerify | None
    token: int = -1                         # last committed token (not yet in the target cache)
    start: int = 0                          # its position = tokens in the target cache
    remaining: int = 0
    # features the draft cache has not seen yet, in (1, c, K*D) chunks: joined once, when the request next
    # drafts (appending to one tensor would copy it every cycle while an adaptive policy decodes plainly)
    pending: list[torch.Tensor] = field(default_factory=list)
    ngram: NgramIndex | None = None         # the committed tokens, for looked-up drafts (options.ngram)
    seed: int | None = None                 # the gumbel sampler's noise key (blockdraft.decoding.gumbel)
    noise: dict[int, torch.Tensor] = field(default_factory=dict)  # its noise rows (V,) by absolute position
    done: bool = False

    @property
    def speculative(self) -> bool:
        return self.block > 1

    @property
    def tree_budget(self) -> int:
        """Nodes of this request's draft trees (0: chains)."""
        tree = self.options.tree
        return 0 if tree == "off" or not self.speculative else TREE_BUDGET if tree == "auto" else tree


@dataclass
class Proposal:
    drafts: torch.Tensor                    # (n,) drafts to verify
    q: torch.Tensor | None                  # (n, V) their distributions (None at T = 0 and with the gumbel sampler)
    confidence: torch.Tensor | None         # (N,) drafter confidence of every drafted slot
    drafter_s: float                        # this cycle's drafting, without the context projection (see below)
    source: int = 0                         # 0: the drafter; n > 0: looked up after an n-token match
    context_s: float = 0.0                  # this request's share of projecting committed context (`_draft_hidden`)
    tree: DraftTree | None = None           # drafts as a tree (`blockdraft.decoding.tree`; drafts = its tokens)
    match: int = 0                          # a tree's looked-up branch (tree.lookup nodes) follows an n-token match
    path: list[int] = field(default_factory=list)  # the tree rows the target accepted (`settle`)

    def layout(self) -> tuple[list[int], torch.Tensor] | None:
        """A tree proposal's verify layout over [token, nodes]: (depth of every row, ancestors (N + 1, N + 1));
        None for chains, trees that are one (verified causally, as usual) included."""
        if self.tree is None or self.tree.is_chain():
            return None
        return self.tree.positions(), self.tree.ancestors()


@dataclass(frozen=True)
class DecodeOptions:
    max_new_tokens: int = 256
    block_size: int | None = None  # None: the drafter's trained block size
    no_draft: bool = False
    stop_token_ids: tuple[int, ...] = ()
    sampling: SamplingParams = field(default_factory=SamplingParams)
    verify: str = "fixed"  # "fixed": verify every draft of the block; "adaptive": see blockdraft.decoding.adaptive
    ngram: bool = False  # also draft by looking the context up (blockdraft.decoding.lookup) when that should commit more
    # "off": verify a chain of drafts; N >= 1: a draft tree of N nodes from the drafter's pass (the adaptive
    # policy verifies the prefix that pays); "auto": a tree of TREE_BUDGET nodes (blockdraft.decoding.tree)
    tree: str | int = "off"

    def __post_init__(self) -> None:
        if self.verify not in VERIFY_MODES:
            raise InvalidArgumentError(f"verify={self.verify!r}: expected one of {VERIFY_MODES}")
        if not (self.tree in TREE_MODES or (isinstance(self.tree, int) and not isinstance(self.tree, bool)
                                            and self.tree >= 1)):
            raise InvalidArgumentError(f"tree={self.tree!r}: {TREE_EXPECTED}")
        if not (isinstance(self.max_new_tokens, int) and self.max_new_tokens >= 1):
            raise InvalidArgumentError(f"max_new_tokens={self.max_new_tokens!r}: expected an integer >= 1")
        if self.block_size is not None and not (isinstance(self.block_size, int) and self.block_size >= 1):
            raise InvalidArgumentError(f"block_size={self.block_size!r}: expected an integer >= 1")


def parse_tree(text: str) -> str | int:
    """A tree setting from text (a command line, a config): "off", "auto" or a node budget >= 1."""
    if text in TREE_MODES:
        return text
    if text.isdigit() and int(text) >= 1:
        return int(text)
    raise InvalidArgumentError(f"tree={text!r}: {TREE_EXPECTED}")


def check_pair(target: TargetModel, drafter: Drafter) -> None:
    """Raise IncompatibleModelsError unless `drafter` was built for a target shaped like `target`."""
    problems = pair_problems(drafter.config, target.hidden_size, target.num_layers, target.vocab_size)
    if problems:
        raise IncompatibleModelsError(problems[0])


class SpeculativeEngine:
    """Runs a target (and optionally a drafter) over token ids. Text handling lives in `api`."""

    def __init__(self, target: TargetModel, drafter: Drafter | None = None,
                 policy: AdaptiveVerify | None = None, draft_window: int | None = None,
                 draft_vocab: bool = True) -> None:
        if draft_window is not None and (not isinstance(draft_window, int) or draft_window < 1):
            raise InvalidArgumentError(f"draft_window={draft_window!r}: expected an integer >= 1 or None")
        self.target = target
        self.drafter = drafter
        self.draft_window = draft_window  # keep only this many context tokens in each draft cache
        self.policy = policy  # learned across calls; built from the measured cost curve on first use
        # the LM head the drafts are scored with: the target's, or the rows of the drafter's own vocabulary
        self.draft_head, self.draft_ids = target.lm_head, None
        # columns of the target's logits (its LM head's rows; models may pad them past the embedding's)
        self.output_size = getattr(target.lm_head, "out_features", target.vocab_size)
        self._nothing = torch.empty(0, dtype=torch.long, device=target.device)  # the drafts of a plain step
        if drafter is not None:
            check_pair(target, drafter)
            target.set_feature_layers(drafter.config.target_layer_ids)
            if draft_vocab and drafter.draft_vocab is not None:
                self.draft_head = draft_head(target.lm_head, drafter.draft_vocab, target.vocab_size)
                self.draft_ids = drafter.draft_vocab.to(target.device)

    def block_size(self, options: DecodeOptions) -> int:
        """The request's block size: 1 (plain decoding) without a drafter or with no_draft. A block size over
        the drafter's trained one is refused even with no_draft (the request asked for something impossible)."""
        if self.drafter is None:
            return 1
        trained = self.drafter.config.block_size
        size = options.block_size or trained
        if size > trained:
            raise InvalidArgumentError(f"block_size={size}: expected at most the drafter's trained size {trained}")
        return 1 if options.no_draft else size

    @torch.inference_mode()
    def decode(self, prompt_ids: list[int], options: DecodeOptions, stats: GenerationStats) -> Iterator[list[int]]:
        """Yield the tokens committed by each step (prefill first). Stops at a stop token or the limit."""
        seq = self.begin(prompt_ids, options, stats)
        cache = self.target.new_cache()
        yield self.prefill(seq, cache)
        while not seq.done:
            t0 = now(self.target.device)
            prop = self.propose(seq)
            device = self.target.device
            ids = torch.cat([torch.tensor([seq.token], device=device), prop.drafts])[None]
            layout = prop.layout()
            tree = None if layout is None else (torch.tensor([layout[0]], device=device), layout[1][None].to(device))
            t1 = now(device)
            logits, feats = self.target.forward(ids, cache, seq.start, features=seq.speculative, tree=tree)
            if seq.policy is not None:
                seq.policy.observe(ids.shape[1], now(device) - t1)
            start = seq.start
            committed = self.settle(seq, prop, logits[0], None if feats is None else feats[0])
            self.target.keep_path(cache, start, prop.path)
            self.target.rollback(cache, seq.start)
            seq.stats.decode_time += now(self.target.device) - t0
            yield committed

    # ------------------------------------------------------------------ the steps (shared with batch_engine)
    def begin(self, prompt_ids: list[int], options: DecodeOptions, stats: GenerationStats) -> DecodeState:
        """Validate a request and set up its decoding state."""
        self._check_prompt(prompt_ids)
        block = self.block_size(options)
        params = options.sampling
        speculative = block > 1
        if speculative and options.tree != "off" and self.target.hybrid:
            if options.tree != "auto":
                raise IncompatibleModelsError(
                    f"tree={options.tree!r}: {type(self.target.model).__name__} has linear-attention layers, whose "
                    "states follow one sequence, so it verifies chains only (expected tree='off' or 'auto')")
            options = replace(options, tree="off")  # "auto" picks what the target can verify: chains
        gumbel = params.gumbel
        stats.block_size, stats.prompt_tokens = block, len(prompt_ids)
        return DecodeState(
            prompt=list(prompt_ids), options=options, stats=stats, block=block,
            gen=None if params.greedy or gumbel else new_generator(params.seed, self.target.device),
            seed=(new_seed() if params.seed is None else params.seed) if gumbel else None,
            draft_cache=DraftCache(self.drafter.config.num_hidden_layers, self.draft_window) if speculative else None,
            policy=self.adaptive_policy() if speculative and options.verify == "adaptive" else None,
            ngram=NgramIndex(prompt_ids) if speculative and options.ngram else None)

    def prefill(self, seq: DecodeState, cache: object, row: int | None = None, chunk: int | None = None) -> list[int]:
        """Run the prompt (into cache row `row` on the fast path); returns [first token].

        With `chunk`, run only the next `chunk` prompt tokens and return [] until the last piece (a server
        interleaves long prompts with other requests' decode cycles); `seq.start` counts the tokens done.
        """
        t0 = now(self.target.device)
        end = len(seq.prompt) if chunk is None else min(len(seq.prompt), seq.start + chunk)
        ids = torch.tensor([seq.prompt[seq.start:end]], device=self.target.device)
        kw = {} if row is None else {"rows": [row]}
        logits, feats = self.target.forward(ids, cache, seq.start, features=seq.speculative, last_only=True, **kw)
        if feats is not None:
            seq.pending.append(feats)
        seq.start = end
        seq.stats.target_forwards += 1
        seq.stats.prefill_time += now(self.target.device) - t0
        if end < len(seq.prompt):
            return []
        seq.token = self._choose(logits[0, -1], seq, len(seq.prompt))
        if seq.ngram is not None:
            seq.ngram.extend([seq.token])
        seq.remaining = seq.options.max_new_tokens - 1
        seq.stats.new_tokens = 1
        seq.done = not self._continues(seq)
        return [seq.token]

    def propose(self, seq: DecodeState, rows: int = 1) -> Proposal:
        """Draft after the last committed token; with an adaptive policy keep only the prefix that pays
        (`rows`: how many rows share the verify forward, which changes what drafting costs)."""
        return self.propose_many([seq], rows)[0]

    def propose_many(self, seqs: list[DecodeState], rows: int | None = None) -> list[Proposal]:
        """`propose` for several requests: each runs its own drafter layers, and the drafted slots of all of
        them go through the LM head in one matmul (the head is most of a drafter call's weight traffic)."""
        rows = len(seqs) if rows is None else rows
        looked = self._lookups(seqs, rows)
        # where the policy planned looked-up drafts alone they run without the drafter (they cost no drafter
        # pass); otherwise a request that drafts trees runs the drafter and any match joins its tree as a branch
        lengths = [0 if p is not None and (not s.tree_budget or s.policy is not None) else self._draft_length(s, rows)
                   for s, p in zip(seqs, looked)]
        looked = [None if n > 0 else p for p, n in zip(looked, lengths)]
        before = [s.stats.drafter_time for s in seqs]
        drafting = [(s, n) for s, n in zip(seqs, lengths) if n > 0]
        if not drafting:
            return [p or self._no_draft() for p in looked]
        t0 = now(self.target.device)
        hidden, context_s = self._draft_hidden(drafting)
        layers_s = now(self.target.device) - t0
        logits = iter(self.drafter.logits(torch.cat(hidden), self.draft_head).split([n for _, n in drafting]))
        share = (now(self.target.device) - t0 - layers_s) / len(drafting)  # the head's time, split evenly
        return [p or (self._proposal(s, next(logits), share, spent, rows, context_s) if n > 0 else self._no_draft())
                for s, n, spent, p in zip(seqs, lengths, before, looked)]

    def _limit(self, seq: DecodeState) -> int:
        """Most drafts this cycle may verify: the block, the tokens still wanted, the target's context."""
        return min(seq.block - 1, seq.remaining - 1, self.target.max_positions - seq.start - 1)

    def _draft_length(self, seq: DecodeState, rows: int) -> int:
        n = self._limit(seq)
        return seq.policy.draft_length(n, rows) if seq.policy is not None and n > 0 else n

    def _lookups(self, seqs: list[DecodeState], rows: int) -> list[Proposal | None]:
        """Drafts looked up in each request's committed context (`blockdraft.decoding.lookup`), where there is a
        match and (with the adaptive policy, planned for the rows together: `AdaptiveVerify.ngram_lengths`)
        verifying them should commit more per second than the drafter or a plain step; without a policy any
        match is used. Verified as deterministic proposals (q = one-hot)."""
        found = [self._lookup(s) for s in seqs]
        planned = [i for i, (s, (_, match)) in enumerate(zip(seqs, found)) if match and s.policy is not None]
        if planned:
            counts = seqs[planned[0]].policy.ngram_lengths([(found[i][1], len(found[i][0])) for i in planned], rows)
            for i, k in zip(planned, counts):
                found[i] = (found[i][0][:k], found[i][1])
        return [self._looked_up(s, drafts, match) if drafts else None for s, (drafts, match) in zip(seqs, found)]

    def _lookup(self, seq: DecodeState) -> tuple[list[int], int]:
        limit = self._limit(seq)
        return seq.ngram.lookup(limit) if seq.ngram is not None and limit > 0 else ([], 0)

    def _looked_up(self, seq: DecodeState, drafts: list[int], match: int) -> Proposal:
        ids = torch.tensor(drafts, device=self.target.device)
        q = None if seq.gen is None else one_hot(ids, self.output_size, torch.float32)
        return Proposal(ids, q, None, 0.0, source=match)

    def _no_draft(self) -> Proposal:
        return Proposal(self._nothing, None, None, 0.0)

    def _draft_hidden(self, drafting: list[tuple[DecodeState, int]]) -> tuple[list[torch.Tensor], float]:
        """One drafter forward for all requests, each over [its token, MASK x n] at its position -> hidden states
        (n, D) of the masked slots, and each request's share of the seconds spent projecting the committed
        features waiting for its draft cache (they go in first, in one call for all requests).

        That projection is timed apart because it is not what a cycle's drafting costs: every committed token
        is projected once, whether or not the cycle that commits it drafts (after a stretch of plain steps
        the next draft projects all of them), so the adaptive policy must not weigh it against this cycle."""
        t0 = now(self.target.device)
        drafter, caches = self.drafter, [s.draft_cache for s, _ in drafting]
        for s, _ in drafting:
            s.pending = [torch.cat(s.pending, dim=1)]
        drafter.extend([s.pending[0] for s, _ in drafting], caches)
        context_s = (now(self.target.device) - t0) / len(drafting)
        for s, _ in drafting:
            s.pending = [s.pending[0][:, :0]]
        mask = drafter.config.mask_token_id
        ids = torch.full((len(drafting), 1 + max(n for _, n in drafting)), mask, device=self.target.device)
        ids[:, 0] = torch.tensor([s.token for s, _ in drafting], device=self.target.device)
        emb = self.target.embedding(ids)
        hidden = drafter.draft_many([emb[r, : n + 1] for r, (_, n) in enumerate(drafting)],
                                    [s.start for s, _ in drafting], [s.pending[0] for s, _ in drafting], caches)
        share = (now(self.target.device) - t0) / len(drafting)
        for s, _ in drafting:
            s.stats.drafter_forwards += 1
            s.stats.drafter_time += share
        return [h[1:] for h in hidden], context_s

    def _proposal(self, seq: DecodeState, logits: torch.Tensor, head_s: float, spent: float,
                  rows: int = 1, context_s: float = 0.0) -> Proposal:
        """Drafts from the drafter's logits (n, V') of one request (V' = its draft vocabulary, or all V): the
        tokens (n,), their distributions (n, V) (None at T = 0) and the drafter's confidence per slot (n,): its
        largest probability there. An adaptive policy then keeps the prefix that pays with `rows` rows in the
        verify forward. `spent`: the request's drafter time before this call, `context_s`: the part of it
        that projected committed context (left out of the proposal's cost, see `_draft_hidden`)."""
        t0 = now(self.target.device)
        params, gen = seq.options.sampling, seq.gen
        ids, vocab = self.draft_ids, self.output_size
        if ids is None and vocab > self.target.vocab_size:  # never draft a padded LM-head column
            logits = logits.clone()
            logits[:, self.target.vocab_size:] = float("-inf")
        if seq.tree_budget and not (seq.policy is not None and seq.policy.chain_cycle(rows)):
            return self._tree_proposal(seq, logits, t0, head_s, spent, rows, context_s)
        q = None
        if params.greedy or params.draft == "greedy":
            drafts = logits.argmax(-1)
            if gen is not None:
                q = one_hot(drafts if ids is None else ids[drafts], vocab, torch.float32)
        elif gen is None:  # gumbel: the drafter's Gumbel-max choice from the noise the target will use
            noise = self._noise(seq, seq.start + 1, logits.shape[0])
            drafts = race_choice(probabilities(logits, params), noise if ids is None else noise[:, ids])
        else:
            q = probabilities(logits, params)
            drafts = sample_index(q, uniforms(logits.shape[0], gen, q.device))
            if ids is not None:  # q is 0 outside the draft vocabulary
                q = q.new_zeros(q.shape[0], vocab).index_copy_(1, ids, q)
        if ids is not None:
            drafts = ids[drafts]
        confidence = torch.softmax(logits.float(), dim=-1).amax(-1)
        seq.stats.drafter_time += head_s + now(self.target.device) - t0
        prop = Proposal(drafts, q, confidence, seq.stats.drafter_time - spent - context_s, context_s=context_s)
        if seq.policy is not None:
            keep = seq.policy.choose(confidence, rows)
            prop.drafts, prop.q = drafts[:keep], None if q is None else q[:keep]
        return prop

    def _tree_proposal(self, seq: DecodeState, logits: torch.Tensor, t0: float, head_s: float, spent: float,
                       rows: int, context_s: float) -> Proposal:
        """A draft tree (`blockdraft.decoding.tree`) from the drafter's logits (n, V') of one request: the best
        `tree_budget` nodes under its slots' distributions (at T = 0 its plain softmax; when sampling, the
        request's truncated distributions, ranked by the gumbel sampler's race where it has one); an adaptive
        policy then keeps the prefix that pays. Timing arguments as `_proposal`."""
        params, ids = seq.options.sampling, self.draft_ids
        probs = torch.softmax(logits.float(), dim=-1) if params.greedy else probabilities(logits, params)
        noise = None
        if seq.seed is not None:
            noise = self._noise(seq, seq.start + 1, logits.shape[0])
            noise = noise if ids is None else noise[:, ids]
        budget = min(seq.tree_budget, self.target.max_positions - seq.start - 1)  # its cache entries fit the context
        log_probs, tokens = slot_candidates(probs, budget, noise)
        branch, match = self._lookup(seq)
        tree = best_first(log_probs.cpu(), tokens if ids is None else ids[tokens], budget, branch)
        confidence = probs.amax(-1)
        seq.stats.drafter_time += head_s + now(self.target.device) - t0
        if seq.policy is not None:
            tree = tree.prefix(seq.policy.tree_size(tree, rows, match))
        return Proposal(tree.tokens, None, confidence, seq.stats.drafter_time - spent - context_s,
                        context_s=context_s, tree=tree, match=match if tree.lookup else 0)

    def _tree_choices(self, seq: DecodeState, tree: DraftTree, logits: torch.Tensor):
        """The target's token at each row of a tree verify (logits (N + 1, V)) as a function of the row: its
        argmax, its gumbel race winner (noise of the row's absolute position), or a draw with the request's
        next uniform, made when the walk reaches the row."""
        params = seq.options.sampling
        if params.greedy:
            return logits.argmax(-1).tolist().__getitem__
        probs = probabilities(logits, params)
        if seq.gen is None:
            noise = self._noise(seq, seq.start + 1, tree.depth + 1)
            return race_choice(probs, noise[tree.positions()]).tolist().__getitem__
        return lambda row: int(sample_index(probs[row], uniforms(1, seq.gen, probs.device)[0]).item())

    def settle(self, seq: DecodeState, prop: Proposal, logits: torch.Tensor, feats: torch.Tensor | None) -> list[int]:
        """Verify `prop` against the target's logits (>= n+1, V) of [token, drafts]; commit; update state.

        The caller rolls the target cache back to `seq.start` (the committed length) afterwards.
        """
        n, params = prop.drafts.numel(), seq.options.sampling
        seq.stats.target_forwards += 1
        rows: list[int] | slice | None = None  # the verified rows whose features go to the drafter
        if prop.tree is not None:  # walk the tree by the target's own tokens
            prop.path, bonus = walk(prop.tree, self._tree_choices(seq, prop.tree, logits[: n + 1]))
            a, rows = len(prop.path), [0, *prop.path]
            drafts = prop.tree.tokens[[r - 1 for r in prop.path]]
        elif params.greedy:
            a, bonus = greedy_verify(prop.drafts, logits[: n + 1])
        elif seq.gen is None:  # gumbel: accept a draft iff it is the target's own choice there
            choice = race_choice(probabilities(logits[: n + 1], params), self._noise(seq, seq.start + 1, n + 1))
            a = accepted_prefix(prop.drafts == choice[:n])
            bonus = int(choice[a].item())
        else:
            p = probabilities(logits[: n + 1], params)
            u = uniforms(n + 1, seq.gen, p.device)
            q = prop.q if prop.q is not None else p.new_zeros(0, p.shape[-1])
            a, bonus = speculative_verify(prop.drafts, q, p, u[:n], u[n])
        if rows is None:
            rows, drafts = slice(0, a + 1), prop.drafts[:a]
        if feats is not None:
            seq.pending.append(feats[None, rows].clone())  # not a view that keeps the whole batch alive
        if seq.policy is not None and prop.tree is not None:
            seq.policy.update_tree(prop.tree, prop.path, prop.drafter_s)
            if prop.match:  # the looked-up branch: its drafts pass in order while the walk follows it
                on_branch = min(next((k for k, r in enumerate(prop.path) if r != k + 1), len(prop.path)),
                                prop.tree.lookup)
                seq.policy.update_ngram(prop.match, prop.tree.lookup, on_branch)
        elif seq.policy is not None and prop.source:
            seq.policy.update_ngram(prop.source, n, a)
        elif seq.policy is not None and prop.confidence is not None:
            seq.policy.update(prop.confidence, n, a, prop.drafter_s)
        committed = drafts.tolist() + [bonus]
        stop = seq.options.stop_token_ids
        for i, t in enumerate(committed):
            if t in stop:
                committed = committed[: i + 1]
                break
        if n > 0:  # a cycle that verified no draft (plain step, length limit) has no acceptance
            seq.stats.acceptance_lengths.append(len(committed))
            seq.stats.drafted.append(n if prop.tree is None else prop.tree.depth)  # a tree: its deepest draft
            seq.stats.verified.append(n)  # a tree: all its nodes went through the target
            seq.stats.sources.append(prop.match or prop.source)
        if seq.ngram is not None:
            seq.ngram.extend(committed)
        seq.start += len(committed)
        seq.remaining -= len(committed)
        seq.token = committed[-1]
        seq.stats.new_tokens += len(committed)
        seq.done = not self._continues(seq)
        return committed

    def _continues(self, seq: DecodeState) -> bool:
        return (seq.remaining > 0 and seq.token not in seq.options.stop_token_ids
                and seq.start < self.target.max_positions)

    @property
    def verify_range(self) -> int:
        """The most tokens a verify forward holds: the root and a block of drafts or a tree of TREE_BUDGET nodes
        (the reach of the measured cost curves)."""
        return max(self.drafter.config.block_size, TREE_BUDGET + 1)

    def verify_tokens(self, options: DecodeOptions) -> int:
        """The most tokens one of this request's verify forwards holds (cache room past its last token)."""
        block = self.block_size(options)
        tree = options.tree if isinstance(options.tree, int) else TREE_BUDGET
        return block if block == 1 or options.tree == "off" else max(block, 1 + tree)

    def adaptive_policy(self) -> AdaptiveVerify:
        """The engine's adaptive verify policy, built on first use from the (cached) measured cost curve."""
        if self.policy is None:
            self.policy = AdaptiveVerify(cached_cost_curve(self.target, self.verify_range))
        return self.policy

    def calibrate_batch(self, rows: int) -> None:
        """Give the adaptive policy the measured cost of verifying in batches of `rows` (once per device and
        batch size: cached like the one-row curve). Only fast-path targets decode in batches."""
        policy = self.adaptive_policy()
        if rows > 1 and rows not in policy.batch_cost and isinstance(self.target, FastTarget):
            policy.set_batch_cost(rows, cached_cost_curve(self.target, self.verify_range, rows=rows))

    def _choose(self, logits: torch.Tensor, seq: DecodeState, position: int) -> int:
        """The token at absolute `position` from one row of logits (V,): argmax, or a draw from the truncated
        distribution (the gumbel sampler's noise at that position, or the next uniform of the generator)."""
        params = seq.options.sampling
        if params.greedy:
            return int(logits.argmax().item())
        probs = probabilities(logits, params)
        if seq.gen is None:
            return int(race_choice(probs, self._noise(seq, position, 1)[0]).item())
        return int(sample_index(probs, uniforms(1, seq.gen, logits.device)[0]).item())

    def _noise(self, seq: DecodeState, first: int, count: int) -> torch.Tensor:
        """The gumbel sampler's noise rows (count, V) for absolute positions first.., each drawn once per request
        (the drafter and the target share them); rows before `first` are dropped."""
        for old in [k for k in seq.noise if k < first]:
            del seq.noise[old]
        missing = [t for t in range(first, first + count) if t not in seq.noise]
        if missing:
            rows = race_noise(seq.seed, missing, self.output_size, self.target.device)
            seq.noise.update(zip(missing, rows))
        return torch.stack([seq.noise[t] for t in range(first, first + count)])

    def _check_prompt(self, prompt_ids: list[int]) -> None:
        vocab = self.target.vocab_size
        if not prompt_ids:
            raise InvalidArgumentError("prompt is empty: expected at least one token")
        bad = [t for t in prompt_ids if not (isinstance(t, int) and 0 <= t < vocab)]
        if bad:
            raise InvalidArgumentError(f"prompt token id {bad[0]!r} is outside the vocabulary [0, {vocab})")
        if len(prompt_ids) >= self.target.max_positions:
            raise InvalidArgumentError(f"prompt has {len(prompt_ids)} tokens: expected fewer than the target's "
                                       f"context of {self.target.max_positions}")
