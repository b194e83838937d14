"""Python front end: text in, text out, over the token-level engine.

    from blockdraft import Pipeline
    pipe = Pipeline.load()                                    # offline default pair
    out = pipe.generate(chat="What is the capital of France?")
    print(out.text, out.stats.mean_acceptance_length)
    for delta in pipe.stream(prompt="def fib(n):"): print(delta, end="")
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch

from blockdraft.decoding.batch_engine import BatchEngine
from blockdraft.decoding.engine import DecodeOptions, SpeculativeEngine
from blockdraft.decoding.sampling import SamplingParams
from blockdraft.decoding.stats import GenerationStats
from blockdraft.errors import InvalidArgumentError
from blockdraft.modeling.checkpoint import load_drafter
from blockdraft.modeling.compile import compile_pair
from blockdraft.modeling.config import DrafterConfig
from blockdraft.modeling.drafter import Drafter
from blockdraft.modeling.memory import memory_report
from blockdraft.modeling.registry import DEFAULT_TARGET, load_target, mask_token_for, shipped_drafter
from blockdraft.modeling.target import TargetModel

log = logging.getLogger(__name__)

Messages = Sequence[dict[str, str]]
# with a seed, the gumbel sampler (exactly plain decoding's tokens, blockdraft.decoding.gumbel); without one, the
# rejection rule, which accepts more drafts at T >= 1 (docs/figures/sampler-v1)
DEFAULT_SAMPLER = "auto"
DEFAULT_TREE = "off"  # draft trees (blockdraft.decoding.tree): "off", "auto" or a node budget


@dataclass
class GenerationOutput:
    text: str
    token_ids: list[int]
    stats: GenerationStats
    finish_reason: str  # "stop" (stop token or string) or "length"

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "token_ids": self.token_ids, "finish_reason": self.finish_reason,
                "stats": self.stats.to_dict()}


@dataclass(frozen=True)
class Prepared:
    """A checked request: prompt token ids, engine options, stop strings (`Pipeline.prepare`)."""
    prompt_ids: list[int]
    options: DecodeOptions
    stop: tuple[str, ...]


class TextStream:
    """Iterator of text deltas; `.output` holds the full GenerationOutput once it is exhausted."""

    def __init__(self, deltas: Iterator[str]) -> None:
        self._deltas = deltas
        self.output: GenerationOutput | None = None

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        return next(self._deltas)

    def close(self) -> None:
        """Stop generating now and free the request's KV cache at once (otherwise that waits for the garbage
        collector: the generator and this stream refer to each other). `.output` stays None if not ended."""
        close = getattr(self._deltas, "close", None)
        if close is not None:
            close()


class Pipeline:
    """A target (+ tokenizer) and an optional DFlash drafter, ready to generate text."""

    def __init__(self, target: TargetModel, drafter: Drafter | None = None, *, untrained_drafter: bool = False,
                 draft_window: int | None = None, draft_vocab: bool = True) -> None:
        if target.tokenizer is None:
            raise InvalidArgumentError("target has no tokenizer: expected one to encode and decode text")
        self.target = target
        self.drafter = drafter
        self.untrained_drafter = untrained_drafter
        self.engine = SpeculativeEngine(target, drafter, draft_window=draft_window, draft_vocab=draft_vocab)
        self.tokenizer = target.tokenizer
        self._draft_vocab = draft_vocab

    @classmethod
    def load(cls, target: str = DEFAULT_TARGET, drafter: str | Path | None = None, *,
             device: str | None = None, dtype: str | torch.dtype | None = None,
             random_drafter_layers: int = 1, seed: int = 0, fast: bool = True,
             draft_window: int | None = None, compile: str | None = None, pack: bool | None = None,
             draft_vocab: bool = True) -> "Pipeline":
        """Load a target by id or folder and a drafter folder.

        Llama / Qwen2 / Qwen3 targets run on our fast path unless `fast=False` (the Hugging Face forward).
        Without `drafter`, the drafter shipped for the target id is used (`blockdraft/weights/`); when there
        is none, or with drafter="untrained", a freshly initialised drafter is built for the target (it drafts
        nothing useful: acceptance length ~1, output still exactly the target's); this is logged as a warning.
        `draft_window` keeps only the last N context tokens in the drafter's cache (bounded memory).
        `compile`: None, or a torch.compile mode ("default"; "reduce-overhead" = CUDA graphs), see blockdraft.modeling.compile.
        `pack`: prepack the target's linear layers for CPU inference (`blockdraft.modeling.packing`); None = on a CPU,
        unless `compile` is given (compilation works on the dense layers).
        `draft_vocab`: score drafts over the drafter's own vocabulary when its folder has one
        (`blockdraft.modeling.draft_vocab`); False scores all of the target's tokens.
        """
        if compile is not None and pack:
            raise InvalidArgumentError(f"compile={compile!r} with pack=True: compilation needs the dense layers, "
                                       "expected one of the two")
        pack = pack if pack is not None else compile is None
        pipe = cls._load(target, drafter, device, dtype, random_drafter_layers, seed, fast, draft_window, pack,
                         draft_vocab)
        if compile is not None:
            compile_pair(pipe.target, pipe.drafter, compile)
        return pipe

    @classmethod
    def _load(cls, target: str, drafter: str | Path | None, device: str | None, dtype: str | torch.dtype | None,
              random_drafter_layers: int, seed: int, fast: bool, draft_window: int | None,
              pack: bool, draft_vocab: bool) -> "Pipeline":
        tgt = load_target(target, device=device, dtype=dtype, fast=fast, pack=pack)
        device, torch_dtype = tgt.device, tgt.dtype
        if drafter is None:
            drafter = shipped_drafter(target)
        untrained = drafter is None or str(drafter) == "untrained"
        if untrained:
            log.warning("no trained drafter for %s: using a freshly initialised drafter; the output is exactly the "
                        "target's, but expect acceptance ~1 and no speed-up", target)
            config = DrafterConfig.for_target(tgt.config_dict(), num_layers=random_drafter_layers,
                                              mask_token_id=mask_token_for(target, tgt.tokenizer, tgt.vocab_size))
            model = Drafter(config).init_weights(seed).to(device=device, dtype=torch_dtype).eval()
        else:
            model = load_drafter(drafter, device=device, dtype=torch_dtype)
        if tgt.packed:
            model.pack()
        return cls(tgt, model, untrained_drafter=untrained, draft_window=draft_window, draft_vocab=draft_vocab)

    def with_drafter(self, drafter: str | Path) -> "Pipeline":
        """A pipeline on this one's target (the same weights, not a copy) with another drafter folder, loaded in
        the target's device and dtype, packed like it, with the same draft window and draft-vocabulary choice:
        two drafters of one target side by side (`blockdraft bench --drafter A --drafter B`)."""
        model = load_drafter(drafter, device=self.target.device, dtype=self.target.dtype)
        if self.target.packed:
            model.pack()
        return type(self)(self.target, model, draft_window=self.engine.draft_window, draft_vocab=self._draft_vocab)

    def memory_report(self, context: int = 1024) -> dict[str, Any]:
        """Parameter and cache bytes of the target and the drafter at `context` tokens (see blockdraft.modeling.memory)."""
        head = self.engine.draft_head if self.engine.draft_ids is not None else None
        return memory_report(self.target, self.drafter, context, self.engine.draft_window, head)

    # ------------------------------------------------------------------ text
    def encode(self, prompt: str | None = None, chat: str | None = None, messages: Messages | None = None,
               chat_template_kwargs: dict[str, Any] | None = None) -> list[int]:
        """Token ids of a raw prompt, or of a chat (one user turn, or full messages) through the template."""
        given = [x is not None for x in (prompt, chat, messages)]
        if sum(given) != 1:
            raise InvalidArgumentError("give exactly one of prompt, chat or messages")
        if prompt is not None:
            return list(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])
        msgs = [{"role": "user", "content": chat}] if chat is not None else list(messages)
        for m in msgs:
            if not isinstance(m, dict) or "role" not in m or "content" not in m:
                raise InvalidArgumentError(f"message {m!r}: expected a dict with 'role' and 'content'")
        if not getattr(self.tokenizer, "chat_template", None):
            raise InvalidArgumentError("this tokenizer has no chat template: use prompt= instead of chat/messages")
        ids = self.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True,
                                                 return_dict=True, **(chat_template_kwargs or {}))["input_ids"]
        return list(ids)

    def stop_token_ids(self) -> tuple[int, ...]:
        ids: set[int] = set()
        for source in (self.tokenizer.eos_token_id, getattr(self.target.model.generation_config, "eos_token_id", None)):
            if isinstance(source, int):
                ids.add(source)
            elif source:
                ids.update(source)
        return tuple(sorted(ids))

    # ------------------------------------------------------------------ generate
    def prepare(self, prompt: str | None = None, *, chat: str | None = None, messages: Messages | None = None,
                max_new_tokens: int = 256, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                seed: int | None = None, block_size: int | None = None, no_draft: bool = False,
                stop: Sequence[str] = (), stop_token_ids: Sequence[int] | None = None, draft: str = "sample",
                verify: str = "adaptive", ngram: bool = True, sampler: str = DEFAULT_SAMPLER,
                tree: str | int = DEFAULT_TREE, chat_template_kwargs: dict[str, Any] | None = None) -> Prepared:
        """A request as token ids and engine options, every value checked (`stream`'s keywords)."""
        ids = self.encode(prompt, chat, messages, chat_template_kwargs)
        stops = tuple(self.stop_token_ids() if stop_token_ids is None else stop_token_ids)
        options = DecodeOptions(max_new_tokens=max_new_tokens, block_size=block_size, no_draft=no_draft,
                                stop_token_ids=stops,
                                sampling=SamplingParams(temperature, top_k, top_p, seed, draft, sampler),
                                verify=verify, ngram=ngram, tree=tree)
        if isinstance(stop, str) or any(not isinstance(s, str) or not s for s in stop):
            raise InvalidArgumentError(f"stop={stop!r}: expected a list of non-empty strings")
        self.engine.block_size(options)  # validate before the first token
        return Prepared(ids, options, tuple(stop))

    def stream(self, prompt: str | None = None, **kwargs: Any) -> TextStream:
        """Like `generate`, as an iterator of text deltas (`.output` is set when it ends)."""
        request = self.prepare(prompt, **kwargs)
        stream = TextStream(iter(()))
        stream._deltas = self._deltas(request.prompt_ids, request.options, request.stop, stream)
        return stream

    def generate(self, prompt: str | None = None, **kwargs: Any) -> GenerationOutput:
        """Generate text. Keywords as `stream`: chat/messages, max_new_tokens, temperature, top_k, top_p,
        seed, block_size, no_draft, stop (strings), stop_token_ids, draft ("sample"|"greedy"), sampler
        ("auto", the default: "gumbel" when a seed is given, else "rejection"; "gumbel": with a seed, exactly the
        tokens plain decoding gives with that seed; "rejection": the min(1, p/q) rule; all sample the target's
        distribution exactly),
        verify ("adaptive", the default: the draft prefix that pays on this device, see blockdraft.decoding.adaptive;
        "fixed": the whole block), ngram (True, the default: also draft by looking the context up in the cycles
        where that should commit more, see blockdraft.decoding.lookup; False: the drafter's drafts only), tree
        ("off": chains of drafts; N: a draft tree of N nodes from the drafter's one pass, looked-up drafts as
        one of its branches; "auto": a tree whose size the adaptive policy picks; see blockdraft.decoding.tree)."""
        stream = self.stream(prompt, **kwargs)
        for _ in stream:
            pass
        assert stream.output is not None
        return stream.output

    def generate_batch(self, prompts: Sequence[str | Messages], *, chat: bool = True, rows: int = 8,
                       max_new_tokens: int | Sequence[int] = 256, temperature: float = 0.0, top_k: int = 0,
                       top_p: float = 1.0, seed: int | None = None, block_size: int | None = None,
                       no_draft: bool = False, draft: str = "sample", verify: str = "adaptive", ngram: bool = True,
                       sampler: str = DEFAULT_SAMPLER, tree: str | int = DEFAULT_TREE,
                       chat_template_kwargs: dict[str, Any] | None = None) -> list[GenerationOutput]:
        """Generate for many prompts at once (`rows` decode together, continuous batching); results in input
        order. Each item is a user message (chat=True), raw text (chat=False) or a list of messages.
        Request i samples with seed `seed + i` when a seed is given. Outputs equal `generate` per prompt."""
        limits = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
        if len(limits) != len(prompts):
            raise InvalidArgumentError(f"{len(limits)} max_new_tokens for {len(prompts)} prompts: expected one each")
        ids = [self.encode(messages=p, chat_template_kwargs=chat_template_kwargs) if not isinstance(p, str)
               else self.encode(chat=p, chat_template_kwargs=chat_template_kwargs) if chat else self.encode(p)
               for p in prompts]
        stops = self.stop_token_ids()
        options = [DecodeOptions(max_new_tokens=m, block_size=block_size, no_draft=no_draft, stop_token_ids=stops,
                                 sampling=SamplingParams(temperature, top_k, top_p, None if seed is None else seed + i,
                                                         draft, sampler), verify=verify, ngram=ngram, tree=tree)
                   for i, m in enumerate(limits)]
        results: list[GenerationOutput | None] = [None] * len(prompts)
        for i, tokens, stats in BatchEngine(self.engine, rows).run(ids, options):
            finish = "stop" if tokens and tokens[-1] in stops else "length"
            results[i] = GenerationOutput(self.tokenizer.decode(tokens, skip_special_tokens=True), tokens, stats, finish)
        return results

    def _deltas(self, prompt_ids: list[int], options: DecodeOptions, stop: tuple[str, ...],
                stream: TextStream) -> Iterator[str]:
        stats = GenerationStats(block_size=1)
        text = TextAssembler(self.tokenizer, stop, options.stop_token_ids)
        for committed in self.engine.decode(prompt_ids, options, stats):
            delta = text.feed(committed)
            if delta:
                yield delta
            if text.finish_reason == "stop":
                break
        delta = text.close()
        if delta:
            yield delta
        stats.new_tokens = len(text.tokens)
        stream.output = text.output(stats)


class TextAssembler:
    """Committed tokens -> text deltas for one request, as plain decoding would end it.

    `feed` each cycle's tokens and show what it returns; it holds back text that a stop string or an
    unfinished UTF-8 character could still change. At the first stop string the text is cut before it and
    `tokens` keep plain decoding's: up to the one that completed it (a cycle can commit several past it);
    a stop token ends it too (`finish_reason` "stop"). `close` returns the rest.
    """

    def __init__(self, tokenizer: Any, stop: Sequence[str] = (), stop_token_ids: Sequence[int] = ()) -> None:
        self.tokenizer, self.stop, self.stop_ids = tokenizer, tuple(stop), set(stop_token_ids)
        self.tokens: list[int] = []
        self.finish_reason = "length"
        self._holdback = max((len(s) for s in self.stop), default=1) - 1
        self._text, self._emitted = "", 0

    def feed(self, committed: list[int]) -> str:
        if self.finish_reason == "stop":
            return ""
        self.tokens.extend(committed)
        text = self._decode(self.tokens)
        cut = _find_stop(text, self.stop, max(self._emitted - self._holdback, 0))
        if cut is not None:  # keep the tokens plain decoding would have: up to the one completing the stop
            self.tokens = self._until_stop(len(self.tokens) - len(committed))
            text, self.finish_reason = text[:cut], "stop"
        elif committed and committed[-1] in self.stop_ids:
            self.finish_reason = "stop"
        self._text = text
        safe = len(text) if self.finish_reason == "stop" else _stable_length(text, self._holdback)
        return self._take(safe)

    def close(self) -> str:
        """The text not shown yet (a held-back tail), once decoding has ended."""
        if self.finish_reason != "stop":
            cut = _find_stop(self._text, self.stop, 0)
            self._text = self._text[:cut] if cut is not None else self._text
        return self._take(len(self._text))

    @property
    def text(self) -> str:
        return self._text[: self._emitted]

    def output(self, stats: GenerationStats) -> GenerationOutput:
        return GenerationOutput(text=self.text, token_ids=self.tokens, stats=stats, finish_reason=self.finish_reason)

    def _take(self, upto: int) -> str:
        if upto <= self._emitted:
            return ""
        delta, self._emitted = self._text[self._emitted:upto], upto
        return delta

    def _decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    def _until_stop(self, done: int) -> list[int]:
        """The shortest prefix of `tokens` longer than `done` whose text holds a stop string."""
        for end in range(done + 1, len(self.tokens) + 1):
            if _find_stop(self._decode(self.tokens[:end]), self.stop, 0) is not None:
                return self.tokens[:end]
        return self.tokens


def _find_stop(text: str, stops: tuple[str, ...], since: int) -> int | None:
    hits = [i for i in (text.find(s, since) for s in stops) if i >= 0]
    return min(hits) if hits else None


def _stable_length(text: str, holdback: int) -> int:
    """How much of `text` can be shown: not an unfinished UTF-8 char, not a possible stop-string prefix."""
    end = len(text) - holdback
    while end > 0 and text[end - 1] == "\ufffd":
        end -= 1
    return max(end, 0)
