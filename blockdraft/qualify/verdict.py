"""From a qualification's figures to marks and a verdict: pure functions, no model.

Each section gets pass / warn / fail and the one-line reasons behind it; the verdict paragraph is built from
the same figures (where speculation pays, where it does not, what the deployment should be), never a fixed
text. A changed greedy output that is not a near-tie, a seeded sample that differs from plain sampling, a
sampler that fails its statistical test or a pair that does not fit fails the report whatever the speed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

PASS, WARN, FAIL = "pass", "warn", "fail"
_ORDER = {PASS: 0, WARN: 1, FAIL: 2}

NOT_A_MATCH_TAU = 1.1  # the drafter's own greedy acceptance at or below this: no better than no drafter
PAYS = 1.05            # a speed-up at least this is "pays"; below 1.0 is "does not pay"; between: "even"
SLOWER = 0.95          # below this a configuration loses clearly (fail); 0.95-1.0 is within a run's noise (warn)
P_FAIL, P_WARN = 1e-3, 1e-2  # the sampler test's p-value thresholds
PREDICTION_TOLERANCE = 0.25  # predicted vs measured speed-up may differ this much (relative) before a warning
CAPACITY_LOSS = 0.10   # the drafter may cost this share of the concurrent requests that fit before a warning


@dataclass
class Section:
    key: str
    title: str
    mark: str = PASS
    reasons: list[str] = field(default_factory=list)

    def flag(self, mark: str, reason: str) -> None:
        self.reasons.append(reason)
        if _ORDER[mark] > _ORDER[self.mark]:
            self.mark = mark


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def worst(marks: list[str]) -> str:
    return max(marks, key=_ORDER.__getitem__, default=PASS)


def pair_section(fig: dict[str, Any]) -> Section:
    s = Section("pair", "Pair")
    pair = fig["pair"]
    for problem in pair["problems"]:
        s.flag(FAIL, problem)
    for warning in pair["warnings"]:
        s.flag(WARN, warning)
    tau = pair.get("greedy_tau_own")
    if tau is not None and tau <= NOT_A_MATCH_TAU:
        s.flag(FAIL, f"not a match: the drafter's own greedy acceptance is {tau:.2f} tokens per cycle, within noise "
                     f"of 1 (no drafter); it was likely trained for another target or fine-tune")
    trained = pair.get("trained_for")
    if trained and pair.get("target_name") and trained != pair["target_name"]:
        s.flag(WARN, f"the drafter records training target {trained!r}, this target is {pair['target_name']!r}")
    if not s.reasons:
        s.reasons.append("shapes, vocabulary, mask token and feature layers fit"
                         + (f"; the drafter's own greedy acceptance is {tau:.2f}" if tau is not None else ""))
    return s


def correctness_section(fig: dict[str, Any]) -> Section:
    s = Section("correctness", "Correctness")
    c = fig["correctness"]
    greedy = c["greedy"]
    real = [d for d in greedy["divergences"] if not d["near_tie"]]
    ties = [d for d in greedy["divergences"] if d["near_tie"]]
    s.flag(PASS if not greedy["divergences"] else FAIL if real else WARN,
           f"greedy: {greedy['identical']}/{greedy['compared']} outputs identical to plain decoding"
           + (f"; {len(real)} differ at a token the target does not hold tied" if real else "")
           + (f"; {len(ties)} differ at a near-tie (top-2 logits within {ties[0]['tie_threshold']:g})" if ties else ""))
    seeded = c.get("seeded")
    if seeded:
        s.flag(PASS if seeded["identical"] == seeded["compared"] else FAIL,
               f"seeded sampling (T={seeded['temperature']:g}): {seeded['identical']}/{seeded['compared']} outputs "
               "identical to plain sampling with the same seed")
    test = c.get("sampler_test")
    if test:
        p = test["p_value"]
        mark = FAIL if p < P_FAIL else WARN if p < P_WARN else PASS
        s.flag(mark, f"sampler test ({test['sampler']}, T={test['temperature']:g}, {test['samples']} samples a side, "
                     f"first {test['tokens']} tokens, {test['categories']} categories): chi-square p = {p:.3g}, "
                     f"{test['mean_committed_per_cycle']:.2f} tokens committed per cycle")
    return s


def acceptance_section(fig: dict[str, Any]) -> Section:
    s = Section("acceptance", "Acceptance")
    priced = False
    for row in _datasets(fig["acceptance"]["rows"]):
        # each row against the break-even of its own cycles (its mean verify length, its drafter's time)
        tau, own, be = row["tau"], row.get("tau_own"), row.get("break_even_tau")
        if be is None or tau is None:
            continue
        priced = True
        if tau < be and (own is None or own < be):
            s.flag(WARN, f"{row['dataset']} at T={row['temperature']:g}: {tau:.2f} committed per verify, under "
                         f"its break-even {be:.2f} (verify of {row['verify_tokens']} tokens)")
    if not s.reasons:
        s.reasons.append("acceptance is above the break-even length of its own cycles wherever the engine drafts"
                         if priced else "no break-even length measured")
    return s


def work_section(fig: dict[str, Any]) -> Section:
    s = Section("work", "Work and break-even")
    w = fig["work"]
    predicted, measured = w.get("predicted_speedup"), w.get("measured_speedup")
    if _finite(predicted) and _finite(measured) and measured > 0:
        off = abs(predicted - measured) / measured
        s.flag(WARN if off > PREDICTION_TOLERANCE else PASS,
               f"predicted {predicted:.2f}x vs measured {measured:.2f}x at T={w.get('temperature', 0):g} "
               f"({100 * off:.0f}% apart)")
    if w.get("flops_ratio") is not None:
        s.reasons.append(f"{w['flops_ratio']:.2f}x plain decoding's FLOPs per committed token, "
                         f"{w['target_tokens_per_committed']:.2f} target tokens per committed token")
    return s


def speed_section(fig: dict[str, Any]) -> Section:
    s = Section("speed", "Speed")
    for row in _datasets(fig["speed"]["single"]):
        x = row["speedup"]
        if x < SLOWER:
            s.flag(FAIL, f"{row['dataset']} at T={row['temperature']:g}: {x:.2f}x plain decoding (slower)")
        elif x < 1.0:
            s.flag(WARN, f"{row['dataset']} at T={row['temperature']:g}: {x:.2f}x plain decoding (even)")
    for row in fig["speed"].get("server") or []:
        x = row.get("speedup")
        if x is not None and x < SLOWER:
            s.flag(FAIL, f"server at concurrency {row['concurrency']}: {x:.2f}x the plain server's throughput")
        elif x is not None and x < 1.0:
            s.flag(WARN, f"server at concurrency {row['concurrency']}: {x:.2f}x the plain server's throughput (even)")
    if not s.reasons:
        s.reasons.append("at least as fast as plain decoding everywhere measured")
    return s


def memory_section(fig: dict[str, Any]) -> Section:
    s = Section("memory", "Memory and capacity")
    m = fig["memory"]
    with_d, without = m["fit_with_drafter"], m["fit_without_drafter"]
    budget = f"{m['budget_bytes'] / 2**30:.1f} GiB at {m['context_tokens']} tokens per request"
    if with_d < 1:
        s.flag(FAIL, f"no request fits in {budget} with the drafter")
    elif without and (without - with_d) / without > CAPACITY_LOSS:
        s.flag(WARN, f"{with_d} concurrent requests fit in {budget} with the drafter, {without} without")
    else:
        s.flag(PASS, f"{with_d} concurrent requests fit in {budget} with the drafter, {without} without")
    return s


SECTIONS = (pair_section, correctness_section, acceptance_section, work_section, speed_section, memory_section)


def sections(fig: dict[str, Any]) -> list[Section]:
    return [build(fig) for build in SECTIONS]


def _datasets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The per-dataset rows (the pooled 'overall' rows repeat them)."""
    return [r for r in rows if r["dataset"] != "overall"]


def _where(rows: list[dict[str, Any]], key: str, label: Any) -> tuple[list[str], list[str], list[str]]:
    """The rows that pay, those slower than plain decoding within a run's noise, and those clearly slower."""
    shown = [(r[key], f"{label(r)} ({r[key]:.2f}x)") for r in rows if r.get(key) is not None]
    return ([t for x, t in shown if x >= PAYS], [t for x, t in shown if SLOWER <= x < 1.0],
            [t for x, t in shown if x < SLOWER])


def _places(rows: list[str]) -> str:
    return ", ".join(r.split(" (")[0] for r in rows)


def verdict(fig: dict[str, Any], marks: list[Section]) -> tuple[str, str]:
    """(overall mark, one paragraph) from the figures and the section marks."""
    by = {s.key: s for s in marks}
    blocking = [s for s in marks if s.mark == FAIL and s.key in ("pair", "correctness", "memory")]
    if blocking:
        reasons = "; ".join(r for s in blocking for r in s.reasons if r)
        return FAIL, f"Do not deploy this pair: {reasons}."
    single = _datasets(fig["speed"]["single"])
    pays, even, below = _where(single, "speedup", lambda r: f"{r['dataset']} at T={r['temperature']:g}")
    loses = even + below
    server = fig["speed"].get("server") or []
    s_pays, s_even, s_below = _where(server, "speedup", lambda r: f"concurrency {r['concurrency']}")
    s_loses = s_even + s_below
    parts = []
    if pays:
        parts.append("Speculation pays on " + ", ".join(pays))
    if loses:
        parts.append(("but not on " if pays else "It does not pay on ") + ", ".join(loses))
    if not pays and not loses:
        parts.append("Speculation is even with plain decoding everywhere measured (within 5%)")
    text = "; ".join(parts) + "."
    if server:
        text += (f" Through the server it pays at {', '.join(s_pays)}" if s_pays else
                 " Through the server it does not beat plain decoding")
        text += (f", and not at {', '.join(s_loses)}." if s_loses else ".")
    adaptive = fig["settings"].get("verify") == "adaptive"
    # the pair is fit to deploy; what is left to say is where: a slow configuration is a warning, not a fail
    mark = PASS if all(s.mark == PASS for s in marks) else WARN
    if not pays and not s_pays:
        text += " Leave it off: it costs memory and buys no latency here."
    elif (loses or s_loses) and not adaptive:
        text += " Deploy with adaptive verify, which falls back to plain decoding where drafting cannot pay."
    elif below or s_below:
        text += (f" Deploy it where it pays; it loses at {_places(below + s_below)} even with adaptive verify on, "
                 "so serve those" + (" loads with --no-draft." if s_below and not below else " with --no-draft."))
    else:
        text += " Deploy it."
    if adaptive and (pays or s_pays) and (even or s_even):  # a shortfall this small is no reason to turn it off
        text += (f" At {_places(even + s_even)} it is within {100 * (1 - SLOWER):.0f}% of plain decoding, inside "
                 "a run's noise: measure again with more prompts before turning it off there.")
    cap = fig["memory"]
    text += (f" Memory: {cap['fit_with_drafter']} concurrent {cap['context_tokens']}-token requests fit in the "
             f"budget with the drafter ({cap['fit_without_drafter']} without).")
    if by["correctness"].mark == WARN:
        text += " Outputs differ only at near-ties (floating-point rounding, as between batch sizes)."
    return mark, text
