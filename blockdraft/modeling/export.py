"""Drafter folders that vLLM and SGLang load as they are, and the commands that serve them (`blockdraft export`).

Our `config.json` is the published z-lab layout (`DrafterConfig.to_dict`). Exporting adds what only the target
can tell: the mask token's string (`dflash_config.mask_token`; older SGLang builds look the mask up by that
string, and add `<|MASK|>` to the tokenizer when it is missing) and which target the drafter was trained on
(top-level `blockdraft`, a key that vLLM, SGLang and z-lab's `dflash` never read). The checks are those
engines' loading rules as read from their source; docs/export.md says which file each comes from and what was
run against their own code.
"""
from __future__ import annotations

import json
import logging
import shlex
from pathlib import Path
from typing import Any

from blockdraft.errors import IncompatibleModelsError, InvalidArgumentError
from blockdraft.modeling.config import DrafterConfig
from blockdraft.modeling.gguf import MARKER
from blockdraft.modeling.pair import pair_problems, target_summary
from blockdraft.modeling.registry import DEFAULT_TARGET, EMBEDDED, resolve_target

log = logging.getLogger(__name__)

ENGINES = ("vllm", "sglang")
RECORD = "blockdraft"  # top-level config.json key holding the training target
# The hub release an embedded GGUF was quantised from: a server loading that id gets other weights than the
# dequantised GGUF our drafters were trained on.
QUANTIZED_FROM = {DEFAULT_TARGET: "HuggingFaceTB/SmolLM2-135M-Instruct"}


def canonical(spec: str) -> str:
    """A target as recorded: a short id or hub id as given, a local folder or .gguf file as an absolute path."""
    path = Path(spec).expanduser()
    return str(path.resolve()) if spec not in EMBEDDED and path.exists() else spec


def _location(spec: str) -> str:
    """Where a server finds `spec`'s weights: an absolute folder (embedded and .gguf targets: their converted
    fp32 folder), or the hub id."""
    found = resolve_target(spec)
    return str(Path(found).resolve()) if Path(found).exists() else found


def export_target(config: DrafterConfig, spec: str | None) -> tuple[str, dict[str, Any]] | None:
    """The target whose tokenizer the export reads, with its summary (`pair.target_summary`).

    `spec`, else the target the drafter records, else the embedded default target; a drafter that does not fit
    a named or recorded target is refused, one that does not fit the implicit default is exported without the
    target's facts (None)."""
    named = spec or trained_target(config)
    summary = target_summary(resolve_target(named or DEFAULT_TARGET))
    problems = pair_problems(config, summary["hidden_size"], summary["num_hidden_layers"], summary["vocab_size"])
    if problems and named is None:
        log.warning("the drafter does not fit the default target %s (%s): exporting it without the mask token's "
                    "string and the training target; pass --target, the target it was trained on", DEFAULT_TARGET,
                    problems[0])
        return None
    if problems:
        raise IncompatibleModelsError(f"--target {named}: {problems[0]}")
    return canonical(named or DEFAULT_TARGET), summary


def trained_target(config: DrafterConfig) -> str | None:
    """The training target `stamp` recorded, or None."""
    record = config.extra.get(RECORD)
    return record.get("target") if isinstance(record, dict) else None


def mask_token_string(tokenizer: Any, mask_token_id: int) -> str | None:
    """The token of id `mask_token_id`, when the tokenizer maps that string back to the same id."""
    token = tokenizer.convert_ids_to_tokens(mask_token_id) if mask_token_id < len(tokenizer) else None
    return token if token is not None and tokenizer.get_vocab().get(token) == mask_token_id else None


def stamp(config: DrafterConfig, spec: str, target: dict[str, Any]) -> None:
    """Write the mask token's string and the training target `spec` (summarised in `target`) into `config`."""
    record: dict[str, Any] = {"target": spec}
    marker = Path(target["folder"]) / MARKER
    if marker.is_file():
        record["target_source"] = json.loads(marker.read_text())
    if spec in QUANTIZED_FROM:
        record["quantized_from"] = QUANTIZED_FROM[spec]
    config.extra[RECORD] = record
    config.mask_token = mask_token_string(target["_tokenizer"], config.mask_token_id)
    if config.mask_token is None:
        log.warning("mask token %d has no string of its own in %s's tokenizer: SGLang builds that resolve the mask "
                    "by its string would add <|MASK|> and use another id", config.mask_token_id, spec)


def engine_problems(config: DrafterConfig, engine: str, target: dict[str, Any] | None = None) -> list[str]:
    """Why `engine` would refuse this drafter, next to `target` (a `pair.target_summary`) when given, or run it
    other than we do (empty when it runs it as we do)."""
    ids, depth = config.target_layer_ids, config.num_target_layers
    problems = [] if target is None else pair_problems(config, target["hidden_size"], target["num_hidden_layers"],
                                                       target["vocab_size"])
    if ids != sorted(set(ids)):
        problems.append(f"target_layer_ids={ids}: vLLM and SGLang capture the target's layers once each, in "
                        "ascending order; expected strictly increasing ids")
    if max(ids) > depth - 2:
        problems.append(f"target_layer_ids has {max(ids)} (the last of {depth} target layers): older vLLM and SGLang "
                        "builds capture layer k's output as the input of layer k + 1 and never reach it, z-lab reads "
                        f"it after the final norm; expected ids <= {depth - 2}")
    kinds = [config.layer_type(i) for i in range(config.num_hidden_layers)]
    if "sliding_attention" in kinds and config.sliding_window is None:
        problems.append("layer_types has sliding_attention layers but sliding_window is null: vLLM and SGLang need "
                        "a window")
    if engine == "vllm" and target is not None and config.vocab_size != target["vocab_size"]:
        problems.append(f"drafter vocab_size={config.vocab_size} but the target has {target['vocab_size']}: vLLM "
                        "then expects a draft-to-target token map (d2t) in the weights")
    if engine == "sglang" and [config.layer_causal(i) for i in range(len(kinds))] != \
            [kind == "sliding_attention" for kind in kinds]:
        problems.append(f"is_causal={config.is_causal}: older SGLang builds ignore it (their full layers attend both "
                        "ways, sliding ones causally); expected it unset")
    return problems


def warn_engine_problems(config: DrafterConfig, target: dict[str, Any] | None) -> None:
    """Log what would keep vLLM or SGLang from running the drafter as we do (our own engine runs it all the same)."""
    for problem in dict.fromkeys(p for engine in ENGINES for p in engine_problems(config, engine, target)):
        log.warning("%s", problem)


def parallel_problems(config: DrafterConfig, tp: int, target: dict[str, Any] | None) -> list[str]:
    """Why the heads of the drafter (and of a local target) cannot be split over `tp` GPUs."""
    if tp < 1:
        raise InvalidArgumentError(f"--tensor-parallel {tp}: expected an integer >= 1")
    heads = {"drafter": (config.num_attention_heads, config.num_key_value_heads)}
    if target is not None:
        heads["target"] = (target["num_attention_heads"], target["num_key_value_heads"])
    problems = []
    for who, (q, kv) in heads.items():
        if q % tp or (kv % tp if kv >= tp else tp % kv):
            problems.append(f"--tensor-parallel {tp}: the {who}'s {q} attention heads / {kv} KV heads do not split "
                            f"over {tp} GPUs (expected a divisor of {q} that divides or is a multiple of {kv})")
    if config.intermediate_size % tp:
        problems.append(f"--tensor-parallel {tp}: the drafter's MLP width {config.intermediate_size} does not split "
                        f"over {tp} GPUs")
    return problems


def serve_command(engine: str, drafter: str, target: str, config: DrafterConfig, tp: int, dtype: str) -> str:
    """The shell command that serves `target` with the drafter folder `drafter` on `engine`."""
    q = shlex.quote
    if engine == "vllm":
        spec = {"method": "dflash", "model": drafter, "num_speculative_tokens": config.block_size - 1}
        mixed = len({config.layer_type(i) for i in range(config.num_hidden_layers)}) > 1
        lines = [f"{'VLLM_USE_V2_MODEL_RUNNER=1 ' if mixed else ''}vllm serve {q(target)}",
                 f"--speculative-config {q(json.dumps(spec))}", "--attention-backend flash_attn", f"--dtype {dtype}",
                 f"--tensor-parallel-size {tp}"]
    else:
        lines = [f"python -m sglang.launch_server --model-path {q(target)}", "--speculative-algorithm DFLASH",
                 f"--speculative-draft-model-path {q(drafter)}", f"--speculative-num-draft-tokens {config.block_size}",
                 "--speculative-draft-attention-backend flashinfer", f"--dtype {dtype}", f"--tp-size {tp}"]
    return " \\\n    ".join(lines)


def target_warning(config: DrafterConfig, served: str) -> str | None:
    """Why serving the target `served` (canonical) is not the pair the drafter was trained as, or None."""
    record = config.extra[RECORD]
    trained = record["target"]
    if served == trained:
        return None
    gguf = record.get("target_source", {}).get("gguf")
    what = f"{trained} ({gguf}, dequantised to fp32)" if gguf else trained
    if served == record.get("quantized_from"):
        return (f"the drafter was trained on {what}, not on the hub weights of {served} that this command loads: the "
                f"output is still {served}'s own, but fewer drafts may be accepted")
    return (f"the drafter was trained on {what} but this command serves {served}: the output is {served}'s own, "
            "acceptance is untested")


def serving(config: DrafterConfig, drafter: str | Path, engine: str, target: str | None = None, tp: int = 1,
            dtype: str = "bfloat16") -> str:
    """The command serving the exported drafter folder `drafter` next to `target` (default: its training target).

    Refuses what the engine cannot run (`engine_problems`, `parallel_problems`, a target it does not fit); warns
    when `target` is not the training target. Both engines run attention in fp16 or bf16 only."""
    trained = trained_target(config)
    if trained is None:
        raise InvalidArgumentError("--serve-command: the drafter records no training target (it was exported "
                                   "without one); expected --target, the target it was trained on")
    served = canonical(target or trained)
    location = _location(served)
    summary = target_summary(location) if Path(location).is_dir() else None
    problems = engine_problems(config, engine, summary) + parallel_problems(config, tp, summary)
    if problems:
        raise IncompatibleModelsError(f"{engine}: " + "; ".join(problems))
    warning = target_warning(config, served)
    if warning:
        log.warning(warning)
    half = "float16" if dtype == "float16" else "bfloat16"
    return serve_command(engine, str(Path(drafter).resolve()), location, config, tp, half)
