"""The side-by-side runner: every method decodes the same prompts in the same process, interleaved.

Methods (names as they appear in the results):
    dflash-bN         DFlash through our engine at run-time block size N (N <= the drafter's trained size)
    dflash-bN-adaptive  the same, verifying only the draft prefix worth its cost (`blockdraft.decoding.adaptive`)
    dflash-...+S      with several --sampler values: the same method with sampler S (gumbel or rejection);
                      with one, names carry no suffix and every method samples with it
    dflash-...@D      with several drafters (`register_drafters`): the same method with drafter D (its label);
                      the first drafter is the pipeline's own
    dflash-bN[-adaptive]-fullvocab  the same, scoring drafts over the whole vocabulary rather than the drafter's
                      own draft vocabulary (methods: dflash_fullvocab; `blockdraft.modeling.draft_vocab`)
    dflash-hfpath     DFlash at the trained block size through the Hugging Face adapter instead of our fast
                      path, on the stock dense layers (methods: dflash_hf): what the fast path buys
    no_draft          plain autoregressive decoding through our engine (the same target forward)
    hf_generate       Hugging Face `generate()` on the same weights (plain decoding, its own KV cache), on the
                      stock dense layers even when our engine runs prepacked ones (`blockdraft.modeling.packing`)
    hf_prompt_lookup  Hugging Face prompt-lookup decoding (`prompt_lookup_num_tokens`), a drafter-free peer

Prompts run prompt-major (for each prompt, every method in turn) so machine noise hits all methods alike.
Multi-turn prompts (MT-Bench) ask each follow-up after the method's own previous answer. A warm-up
generation per method precedes the timed ones. Each generation becomes one `Record` (raw numbers only);
`bench.report` turns records into metrics, tables and plots.
"""
from __future__ import annotations

import logging
import re
import weakref
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterator

import torch
from tqdm import tqdm

from blockdraft.api import DEFAULT_SAMPLER, Pipeline
from blockdraft.bench.metrics import mean_acceptance_length
from blockdraft.decoding.batch_engine import BatchEngine
from blockdraft.decoding.engine import VERIFY_MODES, DecodeOptions, SpeculativeEngine
from blockdraft.decoding.replay import replay_acceptance
from blockdraft.decoding.sampling import SAMPLERS, SamplingParams
from blockdraft.decoding.stats import GenerationStats, now
from blockdraft.errors import InvalidArgumentError
from blockdraft.modeling.target import TargetModel
from blockdraft.prompts import Prompt

log = logging.getLogger(__name__)

BASE_METHODS = ("no_draft", "hf_generate", "hf_prompt_lookup")
_FULL_VOCAB: "weakref.WeakKeyDictionary[Pipeline, SpeculativeEngine]" = weakref.WeakKeyDictionary()
_TREES: "weakref.WeakKeyDictionary[Pipeline, dict[str | int, SpeculativeEngine]]" = weakref.WeakKeyDictionary()
_DRAFTERS: "weakref.WeakKeyDictionary[Pipeline, dict[str, Pipeline | None]]" = weakref.WeakKeyDictionary()


@dataclass
class BenchSettings:
    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    block_sizes: tuple[int, ...] = ()          # DFlash run-time block sizes; () = the trained size
    verify: tuple[str, ...] = ("adaptive",)    # DFlash verify modes: adaptive (generate's default) and/or fixed
    # generate's default (the drafter with looked-up drafts), then the two baselines
    methods: tuple[str, ...] = ("dflash_ngram", "no_draft", "hf_generate")
    samplers: tuple[str, ...] = (DEFAULT_SAMPLER,)  # at T > 0; several: each DFlash method once per sampler
    trees: tuple[str | int, ...] = ("off",)  # DFlash draft trees: "off", "auto", node budgets; several run side by side
    prompt_lookup_tokens: int = 10
    turns: int = 2                             # at most this many turns of multi-turn prompts
    seed: int = 0
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class Record:
    """One timed generation."""

    dataset: str
    prompt_id: str
    turn: int
    method: str
    prompt_tokens: int
    new_tokens: int
    ttft_s: float                 # prompt in -> first new token out
    total_s: float                # prompt in -> last token out
    block_size: int = 1
    acceptance_lengths: list[int] = field(default_factory=list)
    drafted: list[int] = field(default_factory=list)   # per cycle: its deepest draft
    verified: list[int] = field(default_factory=list)  # per cycle: drafts verified (a tree's nodes)
    sources: list[int] = field(default_factory=list)  # per cycle: 0 drafter, n > 0 looked up (blockdraft.decoding.lookup)
    drafter_s: float = 0.0
    target_forwards: int = 0
    token_ids: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def method_names(settings: BenchSettings, trained_block_size: int | None, drafters: tuple[str, ...] = ()
                 ) -> list[str]:
    """Expand 'dflash' into one dflash-bN per block size (and per drafter label, when there are several);
    validate the rest."""
    names: list[str] = []
    labels = [f"@{d}" for d in drafters] if len(drafters) > 1 else [""]
    for m in settings.methods:
        if m in ("dflash", "dflash_fullvocab", "dflash_ngram"):
            if trained_block_size is None:
                raise InvalidArgumentError(f"method {m!r} needs a drafter")
            suffix = "" if m == "dflash" else "-" + m.split("_")[1]
            for b in settings.block_sizes or (trained_block_size,):
                if not 2 <= b <= trained_block_size:
                    raise InvalidArgumentError(f"block size {b}: expected 2..{trained_block_size} (the trained size)")
                names += [f"dflash-b{b}" + ("" if v == "fixed" else f"-{v}") + tree_suffix(t) + suffix + sampler
                          + label for label in labels for v in settings.verify for t in settings.trees
                          for sampler in _sampler_suffixes(settings)]
        elif m in BASE_METHODS:
            names.append(m)
        elif m == "dflash_hf":
            names.append("dflash-hfpath")
        else:
            raise InvalidArgumentError(
                f"method {m!r}: expected dflash, dflash_fullvocab, dflash_ngram, dflash_hf, {', '.join(BASE_METHODS)}")
    bad = [v for v in settings.verify if v not in VERIFY_MODES]
    if bad:
        raise InvalidArgumentError(f"verify mode {bad[0]!r}: expected one of {VERIFY_MODES}")
    for t in settings.trees:
        DecodeOptions(tree=t)  # a bad tree setting fails here, naming itself
    return names


def tree_suffix(tree: str | int) -> str:
    """A tree setting's part of a method name: "" (off), "-tree8", "-treeauto"."""
    return "" if tree == "off" else f"-tree{tree}"


def method_tree(method: str) -> str | int:
    """The tree setting of a method name (`tree_suffix`)."""
    found = re.search(r"-tree(auto|\d+)", method)
    if found is None:
        return "off"
    return "auto" if found.group(1) == "auto" else int(found.group(1))


def register_drafters(pipe: Pipeline, drafters: dict[str, str | None]) -> tuple[str, ...]:
    """Run the bench's DFlash methods with each of `drafters` ({label: folder}, in order) on `pipe`'s target:
    the first label names the pipeline's own drafter (its folder is not loaded again), every other folder is
    loaded once (`Pipeline.with_drafter`). They must read the same target layers (the target hooks one set for
    all its engines) and share a trained block size (the methods' names hold it). Returns the labels, for
    `method_names`."""
    for label in drafters:
        check_drafter_label(label)
    first, *others = drafters
    alternates = {label: pipe.with_drafter(drafters[label]) for label in others}
    mine = pipe.drafter.config
    for label, alt in alternates.items():
        theirs = alt.drafter.config
        if (theirs.target_layer_ids, theirs.block_size) != (mine.target_layer_ids, mine.block_size):
            raise InvalidArgumentError(
                f"drafter {label!r} reads target layers {theirs.target_layer_ids} at block size {theirs.block_size}, "
                f"drafter {first!r} layers {mine.target_layer_ids} at block size {mine.block_size}: expected the "
                "same layers and block size side by side")
    pipe.engine.target.set_feature_layers(mine.target_layer_ids)  # as before the others' engines were built
    _DRAFTERS[pipe] = {first: None} | alternates
    return tuple(drafters)


def check_drafter_label(label: str) -> str:
    """A drafter label goes into method names after '@': letters, digits, '_', '.' and '-' only."""
    if not re.fullmatch(r"[\w.-]+", label):
        raise InvalidArgumentError(f"drafter label {label!r}: expected letters, digits, '_', '.' or '-'")
    return label


def _drafter_pipeline(pipe: Pipeline, method: str) -> tuple[Pipeline, str]:
    """The pipeline of a method's drafter label (`register_drafters`) and the method's name without it."""
    method, at, label = method.partition("@")
    if not at:
        return pipe, method
    alternates = _DRAFTERS.get(pipe, {})
    if label not in alternates:
        raise InvalidArgumentError(f"method {method}@{label}: no drafter labelled {label!r} (expected one of "
                                   f"{sorted(alternates)})")
    return alternates[label] or pipe, method


def method_sampler(method: str, default: str) -> str:
    """The sampler a method names (`dflash-ngram+gumbel@v2` -> gumbel; none named: `default`), resolved."""
    return resolved_sampler(method.partition("@")[0].partition("+")[2] or default)


def resolved_sampler(sampler: str) -> str:
    """The sampler a run uses. Every bench run is seeded, but "auto" measures what a request without a seed
    gets: the rejection rule, which repeats token for token only with a fixed verify length (the adaptive
    policy's lengths follow measured timings); the gumbel sampler repeats with any."""
    return "rejection" if sampler == "auto" else sampler


def _sampler_suffixes(settings: BenchSettings) -> list[str]:
    bad = [x for x in settings.samplers if x not in SAMPLERS]
    if bad or not settings.samplers:
        raise InvalidArgumentError(f"sampler {bad[0] if bad else None!r}: expected some of {SAMPLERS}")
    return [""] if len(settings.samplers) == 1 else [f"+{x}" for x in settings.samplers]


# ------------------------------------------------------------------ one generation per method
class _FirstTokenClock:
    """A `generate()` streamer that notes when the first new token arrives (the first put is the prompt)."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.calls, self.first = device, 0, None

    def put(self, _value: torch.Tensor) -> None:
        self.calls += 1
        if self.calls == 2:
            self.first = now(self.device)

    def end(self) -> None:
        pass


def _engine_run(pipe: Pipeline, ids: list[int], method: str, s: BenchSettings, stops: tuple[int, ...],
                seed: int) -> tuple[list[int], GenerationStats, float]:
    options = _options(method, s, stops, seed)
    stats = GenerationStats(block_size=1)
    engine = _engine(pipe, method)
    t0 = now(pipe.target.device)
    tokens = [t for chunk in engine.decode(ids, options, stats) for t in chunk]
    elapsed = now(pipe.target.device) - t0
    if engine.target is not pipe.target:
        engine.target.set_feature_layers([])  # unhook the shared HF layers: the other methods pay nothing
    return tokens, stats, elapsed


def _engine(pipe: Pipeline, method: str) -> SpeculativeEngine:
    """The engine a method runs on: the pipeline's (or its drafter's, by label), or a variant (built once, then
    reused)."""
    pipe, method = _drafter_pipeline(pipe, method)
    if method == "dflash-hfpath":
        return _hf_path_engine(pipe)
    if method.partition("+")[0].endswith("-fullvocab"):
        if pipe not in _FULL_VOCAB:  # with its own adaptive policy, learned across calls like the pipeline's
            _FULL_VOCAB[pipe] = SpeculativeEngine(pipe.target, pipe.drafter, draft_window=pipe.engine.draft_window,
                                                   draft_vocab=False)
        return _FULL_VOCAB[pipe]
    tree = method_tree(method)
    if tree != "off":  # its own adaptive policy: a tree's deeper acceptance must not teach the chains' policy
        engines = _TREES.setdefault(pipe, {})
        if tree not in engines:
            engines[tree] = SpeculativeEngine(pipe.target, pipe.drafter, draft_window=pipe.engine.draft_window,
                                              draft_vocab=pipe.engine.draft_ids is not None)
        return engines[tree]
    return pipe.engine


def _hf_path_engine(pipe: Pipeline) -> SpeculativeEngine:
    """The same target weights and drafter through the Hugging Face adapter (hooks, DynamicCache), on the
    stock dense layers: what the fast path (our loop, static cache, packed kernels) buys over it."""
    return SpeculativeEngine(TargetModel(pipe.target.stock_model(), pipe.tokenizer), pipe.drafter,
                             draft_window=pipe.engine.draft_window)


def _hf_run(pipe: Pipeline, ids: list[int], method: str, s: BenchSettings, stops: tuple[int, ...],
            seed: int) -> tuple[list[int], float, float]:
    device = pipe.target.device
    kwargs: dict[str, Any] = {"max_new_tokens": s.max_new_tokens, "eos_token_id": list(stops),
                              "pad_token_id": stops[0] if stops else None}
    if s.temperature > 0:
        torch.manual_seed(seed)
        kwargs.update(do_sample=True, temperature=s.temperature, top_p=s.top_p, top_k=0)
    else:
        kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    if method == "hf_prompt_lookup":
        kwargs["prompt_lookup_num_tokens"] = s.prompt_lookup_tokens
    clock = _FirstTokenClock(device)
    x = torch.tensor([ids], device=device)
    t0 = now(device)
    with torch.inference_mode():
        out = pipe.target.stock_model().generate(x, attention_mask=torch.ones_like(x), streamer=clock, **kwargs)
    total = now(device) - t0
    return out[0, len(ids):].tolist(), (clock.first or t0 + total) - t0, total


def _options(method: str, s: BenchSettings, stops: tuple[int, ...], seed: int) -> DecodeOptions:
    sampling = SamplingParams(s.temperature, 0, s.top_p, seed, sampler=method_sampler(method, s.samplers[0]))
    method = method.partition("@")[0].partition("+")[0]
    block = int(method.split("-")[1][1:]) if method.startswith("dflash-b") else None
    return DecodeOptions(max_new_tokens=s.max_new_tokens, block_size=block, no_draft=method == "no_draft",
                         stop_token_ids=stops, sampling=sampling,
                         verify="adaptive" if "-adaptive" in method else "fixed", ngram=method.endswith("-ngram"),
                         tree=method_tree(method))


def run_one(pipe: Pipeline, dataset: str, prompt_id: str, turn: int, ids: list[int], method: str,
            s: BenchSettings, seed: int) -> Record:
    stops = pipe.stop_token_ids()
    if method.startswith("hf_"):
        tokens, ttft, total = _hf_run(pipe, ids, method, s, stops, seed)
        return Record(dataset, prompt_id, turn, method, len(ids), len(tokens), ttft, total, token_ids=tokens)
    tokens, st, total = _engine_run(pipe, ids, method, s, stops, seed)
    return Record(dataset, prompt_id, turn, method, len(ids), len(tokens), st.prefill_time, total,
                  block_size=st.block_size, acceptance_lengths=list(st.acceptance_lengths), drafted=list(st.drafted),
                  verified=list(st.verified), sources=list(st.sources),
                  drafter_s=st.drafter_time, target_forwards=st.target_forwards, token_ids=tokens)


# ------------------------------------------------------------------ the loop
def _turns(prompt: Prompt, max_turns: int) -> list[str]:
    return [prompt.text, *prompt.followups][:max_turns]


def _conversations(pipe: Pipeline, dataset: str, prompts: list[Prompt], methods: list[str], s: BenchSettings,
                   ) -> Iterator[Callable[[], Record]]:
    """Yield one thunk per (prompt, turn, method), prompt-major; each turn follows the method's own answer."""
    for p_index, prompt in enumerate(prompts):
        history = {m: list(prompt.messages[:-1]) for m in methods}
        for turn, user in enumerate(_turns(prompt, s.turns), start=1):
            for m in methods:
                def thunk(m: str = m, turn: int = turn, user: str = user) -> Record:
                    history[m].append({"role": "user", "content": user})
                    ids = pipe.encode(messages=history[m], chat_template_kwargs=s.chat_template_kwargs)
                    rec = run_one(pipe, dataset, prompt.id, turn, ids, m, s, seed=s.seed * 100_003 + p_index)
                    answer = pipe.tokenizer.decode(rec.token_ids, skip_special_tokens=True)
                    history[m].append({"role": "assistant", "content": answer})
                    return rec
                yield thunk


def count_generations(prompts_by_dataset: dict[str, list[Prompt]], methods: list[str], turns: int) -> int:
    return sum(len(_turns(p, turns)) for ps in prompts_by_dataset.values() for p in ps) * len(methods)


def warm_up(pipe: Pipeline, methods: list[str], s: BenchSettings) -> None:
    """One short generation per method, untimed (allocations, lazy init, caches)."""
    ids = pipe.encode(chat="Say hello.", chat_template_kwargs=s.chat_template_kwargs)
    short = BenchSettings(**{**asdict(s), "max_new_tokens": min(16, s.max_new_tokens)})
    for m in methods:
        run_one(pipe, "warmup", "warmup", 1, ids, m, short, seed=0)


def run_bench(pipe: Pipeline, prompts_by_dataset: dict[str, list[Prompt]], s: BenchSettings,
              progress: bool = True, drafters: tuple[str, ...] = ()) -> tuple[list[str], list[Record]]:
    """Every method on every prompt, prompt-major; `drafters`: the labels of `register_drafters`."""
    trained = pipe.drafter.config.block_size if pipe.drafter is not None else None
    methods = method_names(s, trained, drafters)
    warm_up(pipe, methods, s)
    records: list[Record] = []
    total = count_generations(prompts_by_dataset, methods, s.turns)
    with tqdm(total=total, desc="bench", unit="gen", dynamic_ncols=True, disable=not progress) as bar:
        for dataset, prompts in prompts_by_dataset.items():
            for thunk in _conversations(pipe, dataset, prompts, methods, s):
                rec = thunk()
                records.append(rec)
                bar.set_postfix(dataset=dataset, method=rec.method, tok_s=f"{rec.new_tokens / rec.total_s:.1f}")
                bar.update(1)
    return methods, records


def run_replay(pipe: Pipeline, prompts: list[Prompt], s: BenchSettings, rows: int) -> dict[str, Any]:
    """Greedy acceptance at each block size by replay (`blockdraft.decoding.replay`): the first turns decode
    plainly, `rows` at a time, then each block size replays every continuation through the drafter."""
    if s.temperature != 0:
        raise InvalidArgumentError(f"replay measures greedy acceptance: expected temperature 0, got {s.temperature}")
    ids = [pipe.encode(messages=p.messages, chat_template_kwargs=s.chat_template_kwargs) for p in prompts]
    stops = pipe.stop_token_ids()
    plain = [_options("no_draft", s, stops, 0)] * len(ids)
    t0 = now(pipe.target.device)
    continuations = {i: tokens for i, tokens, _ in BatchEngine(pipe.engine, rows).run(ids, plain)}
    out: dict[str, Any] = {"requests": len(ids), "new_tokens": sum(len(t) for t in continuations.values()),
                           "plain_seconds": now(pipe.target.device) - t0, "mean_acceptance_length": {}}
    for label, engine in _drafter_engines(pipe):
        for block in s.block_sizes or (engine.drafter.config.block_size,):
            for tree in s.trees:
                options = DecodeOptions(max_new_tokens=s.max_new_tokens, block_size=block, stop_token_ids=stops,
                                        tree=tree)
                name = f"b{block}{tree_suffix(tree)}{label}"
                lengths = [replay_acceptance(engine, ids[i], continuations[i], options)
                           for i in tqdm(range(len(ids)), desc=f"replay {name}", unit="prompt", dynamic_ncols=True)]
                out["mean_acceptance_length"][name] = mean_acceptance_length(lengths)
    return out


def _drafter_engines(pipe: Pipeline) -> list[tuple[str, SpeculativeEngine]]:
    """(name suffix, engine) of each registered drafter (`register_drafters`); ("", the pipeline's) without."""
    drafters = _DRAFTERS.get(pipe)
    if drafters is None or len(drafters) < 2:
        return [("", pipe.engine)]
    return [(f"@{label}", (alt or pipe).engine) for label, alt in drafters.items()]


def run_batched(pipe: Pipeline, prompts_by_dataset: dict[str, list[Prompt]], methods: list[str], s: BenchSettings,
                rows: int, rounds: int = 1) -> dict[str, dict[str, Any]]:
    """First turns of all prompts through the batched engine, `rows` at a time, per engine method:
    total new tokens / wall time, and greedy agreement with the batched plain decoding. With `rounds` > 1
    the methods run that many times, in reverse order every other round (ABBA), so a machine whose speed
    drifts during the run biases no method; tokens/s is over all rounds, with each round's figure kept."""
    if not isinstance(rounds, int) or rounds < 1:
        raise InvalidArgumentError(f"rounds={rounds!r}: expected an integer >= 1")
    engine_methods = [m for m in methods if not m.startswith("hf_") and m != "dflash-hfpath"]
    ids = [pipe.encode(messages=p.messages, chat_template_kwargs=s.chat_template_kwargs)
           for ps in prompts_by_dataset.values() for p in ps]
    out: dict[str, dict[str, Any]] = {}
    outputs: dict[str, list[list[int]]] = {}
    lengths: dict[str, list[list[int]]] = {}
    for m in engine_methods:
        if "-adaptive" in m.partition("@")[0]:  # measure (or load) the batch's verify cost curve outside the timing
            _engine(pipe, m).calibrate_batch(min(rows, len(ids)))
    order = [m for r in range(rounds) for m in (engine_methods if r % 2 == 0 else engine_methods[::-1])]
    for m in tqdm(order, desc=f"batch {rows}", unit="run", dynamic_ncols=True):
        options = [_options(m, s, pipe.stop_token_ids(), s.seed * 100_003 + i) for i in range(len(ids))]
        t0 = now(pipe.target.device)
        results = {i: (tokens, st) for i, tokens, st in BatchEngine(_engine(pipe, m), rows).run(ids, options)}
        seconds = now(pipe.target.device) - t0
        outputs[m] = [results[i][0] for i in range(len(ids))]
        tokens = sum(len(t) for t in outputs[m])
        lengths.setdefault(m, []).extend(results[i][1].acceptance_lengths for i in range(len(ids)))
        rec = out.setdefault(m, {"rows": rows, "requests": len(ids), "new_tokens": 0, "seconds": 0.0,
                                 "rounds_tokens_per_second": []})
        rec["new_tokens"] += tokens
        rec["seconds"] += seconds
        rec["rounds_tokens_per_second"].append(tokens / seconds if seconds else 0.0)
        rec["tokens_per_second"] = rec["new_tokens"] / rec["seconds"] if rec["seconds"] else 0.0
        rec["mean_acceptance_length"] = mean_acceptance_length(lengths[m])
    if s.temperature == 0 and "no_draft" in outputs:
        for m, toks in outputs.items():
            out[m]["identical_to_no_draft"] = sum(a == b for a, b in zip(toks, outputs["no_draft"]))
    return out
