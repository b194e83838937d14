"""A qualification's report: report.json (every figure), report.md (plots as PNG files beside it) and
report.html (one self-contained file, the same plots embedded). Both texts come from one list of blocks,
so they never disagree."""
from __future__ import annotations

import base64
import html
import json
import math
from pathlib import Path
from typing import Any

from blockdraft.files import atomic_path
from blockdraft.qualify.verdict import Section

SCHEMA = "blockdraft.qualify/1"
Block = tuple  # ("h1" | "h2" | "p" | "list", text...) | ("table", header, rows) | ("img", file, caption)


def _x(v: float | None, digits: int = 2, suffix: str = "") -> str:
    return "-" if v is None else f"{v:.{digits}f}{suffix}"


def _stages(fig: dict[str, Any]) -> str:
    stages = fig.get("stage_seconds") or {}
    return f" ({', '.join(f'{name} {sec:.0f}' for name, sec in stages.items())})" if stages else ""


def _break_even(row: dict[str, Any]) -> str:
    be = row.get("break_even_tau")
    return "-" if be is None else f"{be:.2f} ({row['verify_tokens']} tokens)"


def _mb(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:.1f} MB"


def blocks(report: dict[str, Any], plots: dict[str, str]) -> list[Block]:
    fig, marks = report["figures"], {s["key"]: s for s in report["sections"]}
    out: list[Block] = [("h1", f"Qualification: {fig['pair']['target_name']} + "
                               f"{Path(fig['pair'].get('drafter', {}).get('folder') or 'no drafter').name}"),
                        ("p", f"**Verdict: {report['mark'].upper()}.** {report['verdict']}"),
                        ("p", f"Run: {report['settings_line']}; {report['seconds']:.0f} s{_stages(fig)} on "
                              f"{report['machine']}.")]

    def head(key: str) -> None:
        s = marks[key]
        out.append(("h2", f"{s['title']}: {s['mark'].upper()}"))
        out.append(("list", s["reasons"]))

    pair = fig["pair"]
    head("pair")
    t, d = pair["target"], pair.get("drafter") or {}
    out.append(("table", ["", "target", "drafter"], [
        ["architecture", t["architecture"], d.get("architecture", "-")],
        ["hidden size", t["hidden_size"], d.get("hidden_size", "-")],
        ["layers", t["num_hidden_layers"], f"{d.get('num_hidden_layers', '-')} (reads target layers "
                                           f"{d.get('target_layer_ids', '-')} of {d.get('num_target_layers', '-')})"],
        ["vocabulary", t["vocab_size"], f"{d.get('vocab_size', '-')} (draft vocabulary: "
                                        f"{d.get('draft_vocab') or 'all'})"],
        ["mask token", "-", f"{d.get('mask_token_id', '-')} ({d.get('mask_token')!r})"],
        ["chat template / thinking mode", f"{'yes' if pair['tokenizer']['chat_template'] else 'no'} / "
                                          f"{'yes' if pair['tokenizer']['thinking_mode'] else 'no'}", "the target's"],
        ["trained for", "-", pair.get("trained_for") or "not recorded"],
        ["own greedy acceptance (tau)", "-", _x(pair.get("greedy_tau_own"))]]))

    head("correctness")
    c = fig["correctness"]
    for dv in c["greedy"]["divergences"]:
        out.append(("p", f"First divergence, {dv['dataset']}/{dv['prompt_id']} at token {dv['position']} "
                         f"({'near-tie' if dv['near_tie'] else 'NOT a near-tie'}: top-2 logit gap "
                         f"{dv['logit_gap']:.2g}): after `{dv['context']}` ours `{dv['ours']}`, plain `{dv['plain']}`"))
    test = c.get("sampler_test")
    if test:
        out.append(("p", f"Sampler test prompt: \"{test['prompt']}\"; chi-square {test['chi_square']:.1f} on "
                         f"{test['dof']} degrees of freedom; {test['cycles_with_2_or_more_accepted']} cycles accepted "
                         "2 or more drafts."))

    head("acceptance")
    acc = fig["acceptance"]
    out.append(("table", ["dataset", "T", "tau (default engine)", "tau (drafter cycles)", "tau (drafter alone, replay)",
                          "break-even tau (its mean verify)", "lookup cycles / cycles"],
                [[r["dataset"], f"{r['temperature']:g}", _x(r["tau"]), _x(r["tau_drafter_cycles"]), _x(r["tau_own"]),
                  _break_even(r), f"{r['lookup_cycles']} / {r['cycles']}"] for r in acc["rows"]]))
    if "acceptance" in plots:
        out.append(("img", plots["acceptance"], "The drafter alone at T=0 (replay): committed tokens per cycle, "
                                                "and acceptance per draft position"))

    head("work")
    w = fig["work"]
    out.append(("table", ["figure", "value"], [
        ["target tokens processed per committed token", _x(w["target_tokens_per_committed"])],
        ["drafter share of decode time", _x(None if w["drafter_share_of_decode"] is None
                                            else 100 * w["drafter_share_of_decode"], 1, "%")],
        ["estimated FLOPs per committed token", f"{w['flops_per_committed_token'] / 1e9:.2f} GFLOP "
                                               f"({_x(w['flops_ratio'])}x plain's {w['plain_flops_per_token'] / 1e9:.2f})"],
        ["break-even tau (verify of the mean length, drafter included)", _x(w["break_even_tau"])],
        [f"predicted / measured speed-up (T={w['temperature']:g})",
         f"{_x(w['predicted_speedup'])}x / {_x(w['measured_speedup'])}x"],
        ["cycles that decoded plainly (adaptive fallback)", f"{w['plain_cycles']} of {w['plain_cycles'] + w['cycles']}"
         if w.get("plain_cycles") is not None and w.get("cycles") is not None else "-"]]))
    if "cost" in plots:
        out.append(("img", plots["cost"], f"Verify cost curve at {w['context_tokens']} tokens of context "
                    "(median of 9 rounds per size)"))

    head("speed")
    out.append(("table", ["dataset", "T", "speed-up (end to end)", "s per response (ours / plain)",
                          "tok/s (ours / plain)", "TTFT ms (ours / plain)"],
                [[r["dataset"], f"{r['temperature']:g}", f"{r['speedup']:.2f}x",
                  f"{r['seconds_per_response']:.2f} / {r['plain_seconds_per_response']:.2f}",
                  f"{r['tokens_per_s']:.1f} / {r['plain_tokens_per_s']:.1f}",
                  f"{r['ttft_ms']:.0f} / {r['plain_ttft_ms']:.0f}"] for r in fig["speed"]["single"]]))
    server = fig["speed"].get("server")
    if server:
        out.append(("table", ["concurrency", "tok/s (ours / plain)", "speed-up", "p95 latency s (ours / plain)",
                              "errors"],
                    [[r["concurrency"], f"{_x(r['tokens_per_s'], 1)} / {_x(r['plain_tokens_per_s'], 1)}",
                      f"{_x(r['speedup'])}x", f"{_x(r['latency_p95_s'])} / {_x(r['plain_latency_p95_s'])}",
                      r["errors"]] for r in server]))
        out.append(("p", "Server figures are end to end at the client: all clients' output tokens over the wall time "
                         "of the level, prefills, queueing (past --max-batch) and HTTP included. The longer the prompts against "
                         "the answers, the more prefill, which speculation does not speed up, dilutes the speed-up."))
    else:
        out.append(("p", "The server was not measured (--no-server)."))
    if "speed" in plots:
        out.append(("img", plots["speed"], "Speed-up over plain decoding"))

    head("memory")
    m = fig["memory"]
    out.append(("table", ["", "parameters", f"cache per request ({m['context_tokens']} tokens)",
                          f"requests in {m['budget_bytes'] / 2**30:.1f} GiB"], [
        ["target", _mb(m["target_parameters_bytes"]), _mb(m["target_kv_bytes"]), m["fit_without_drafter"]],
        ["+ drafter", _mb(m.get("drafter_parameters_bytes")), _mb(m.get("drafter_cache_bytes")),
         m["fit_with_drafter"]]]))
    out.append(("h2", f"Verdict: {report['mark'].upper()}"))
    out.append(("p", report["verdict"]))
    for note in fig.get("notes") or []:
        out.append(("p", f"Note: {note}"))
    return out


def markdown(items: list[Block]) -> str:
    lines: list[str] = []
    for item in items:
        kind = item[0]
        if kind == "h1":
            lines += [f"# {item[1]}", ""]
        elif kind == "h2":
            lines += [f"## {item[1]}", ""]
        elif kind == "p":
            lines += [item[1], ""]
        elif kind == "list":
            lines += [f"- {x}" for x in item[1]] + [""]
        elif kind == "table":
            header, rows = item[1], item[2]
            lines += ["| " + " | ".join(map(str, header)) + " |", "|" + "---|" * len(header)]
            lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows] + [""]
        elif kind == "img":
            lines += [f"![{item[2]}]({item[1]})", ""]
    return "\n".join(lines)


_CSS = ("body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#222}"
        "table{border-collapse:collapse;margin:.5rem 0}td,th{border:1px solid #ccc;padding:.2rem .5rem;text-align:left}"
        "th{background:#f3f3f3}img{max-width:100%}.pass{color:#1a7f37}.warn{color:#9a6700}.fail{color:#cf222e}"
        "code{background:#f3f3f3;padding:0 .2rem}")


def _inline(text: str) -> str:
    """Escaped text with **bold** and `code` spans."""
    parts = html.escape(str(text)).split("`")
    text = "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))
    parts = text.split("**")
    return "".join(f"<strong>{p}</strong>" if i % 2 else p for i, p in enumerate(parts))


def _mark_class(text: str) -> str:
    tail = text.rsplit(":", 1)[-1].strip().lower()
    return f' class="{tail}"' if tail in ("pass", "warn", "fail") else ""


def to_html(items: list[Block], folder: Path) -> str:
    body: list[str] = []
    for item in items:
        kind = item[0]
        if kind in ("h1", "h2"):
            body.append(f"<{kind}{_mark_class(item[1])}>{_inline(item[1])}</{kind}>")
        elif kind == "p":
            body.append(f"<p>{_inline(item[1])}</p>")
        elif kind == "list":
            body.append("<ul>" + "".join(f"<li>{_inline(x)}</li>" for x in item[1]) + "</ul>")
        elif kind == "table":
            head = "".join(f"<th>{_inline(h)}</th>" for h in item[1])
            rows = "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in row) + "</tr>" for row in item[2])
            body.append(f"<table><tr>{head}</tr>{rows}</table>")
        elif kind == "img":
            data = base64.b64encode((folder / item[1]).read_bytes()).decode()
            body.append(f'<figure><img alt="{html.escape(item[2])}" src="data:image/png;base64,{data}">'
                        f"<figcaption>{_inline(item[2])}</figcaption></figure>")
    title = html.escape(items[0][1]) if items else "qualification"
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
            f"<style>{_CSS}</style></head><body>{''.join(body)}</body></html>\n")


def plots(fig: dict[str, Any], folder: Path) -> dict[str, str]:
    """PNG files in `folder`; {name: file name}."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out: dict[str, str] = {}
    acc = fig["acceptance"]
    if any(acc["histogram"]):
        f, (a, b) = plt.subplots(1, 2, figsize=(9, 3.2))
        block = acc["block_size"]
        a.bar(range(1, block + 1), acc["histogram"])
        a.set(xlabel="tokens committed per cycle", ylabel="share of cycles")
        b.plot(range(1, block), [x if x is not None else float("nan") for x in acc["per_position"]], marker="o")
        b.set(xlabel="draft position", ylabel="accepted | reached", ylim=(0, 1))
        out["acceptance"] = _save(f, folder / "acceptance.png")
    w = fig["work"]
    curve = {int(q): s for q, s in w["verify_cost_s"].items()}
    if curve:
        f, a = plt.subplots(figsize=(5, 3.2))
        a.plot(list(curve), [s / curve[1] for s in curve.values()], marker=".")
        a.set(xlabel="tokens verified in one forward", ylabel="cost / one-token step")
        if w.get("break_even_tau"):
            a.axhline(w["break_even_tau"], ls="--", color="grey", label=f"break-even tau {w['break_even_tau']:.2f}")
            a.legend()
        out["cost"] = _save(f, folder / "cost.png")
    single = fig["speed"]["single"]
    server = fig["speed"].get("server") or []
    f, axes = plt.subplots(1, 2 if server else 1, figsize=(9 if server else 5, 3.2), squeeze=False)
    a = axes[0][0]
    labels = [f"{r['dataset']} T={r['temperature']:g}" for r in single]
    a.bar(range(len(single)), [r["speedup"] for r in single])
    a.set_xticks(range(len(single)), labels, fontsize=7, rotation=35, ha="right")
    a.axhline(1.0, color="grey", ls="--")
    a.set(ylabel="speed-up, one request")
    if server:
        b = axes[0][1]
        cs = [r["concurrency"] for r in server]
        b.plot(cs, [r["tokens_per_s"] for r in server], marker="o", label="DFlash")
        b.plot(cs, [r["plain_tokens_per_s"] for r in server], marker="o", label="plain")
        b.set(xscale="log", xlabel="concurrent clients", ylabel="server output tok/s")
        b.legend()
    out["speed"] = _save(f, folder / "speed.png")
    return out


def _save(fig: Any, path: Path) -> str:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    return path.name


def write(report: dict[str, Any], folder: Path) -> list[Path]:
    """report.json, report.md and report.html (with the plots) in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    items = blocks(report, plots(report["figures"], folder))
    paths = []
    data = _finite({"schema": SCHEMA, **report})
    for name, text in (("report.json", json.dumps(data, indent=1, default=str, allow_nan=False)),
                       ("report.md", markdown(items)), ("report.html", to_html(items, folder))):
        with atomic_path(folder / name) as tmp:
            tmp.write_text(text)
        paths.append(folder / name)
    return paths


def _finite(value: Any) -> Any:
    """NaN and infinities (a ratio with nothing to divide) as null: report.json stays strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def section_dicts(marks: list[Section]) -> list[dict[str, Any]]:
    return [{"key": s.key, "title": s.title, "mark": s.mark, "reasons": s.reasons} for s in marks]
