"""scripts/serve_sweep.py, the multi-server load sweep: its summary, ratios and identity counts, and one real run
on a tiny server."""
from __future__ import annotations

import contextlib
import json
import sys

import pytest

from blockdraft.bench import servers
from blockdraft.errors import BlockdraftError, InvalidArgumentError
from tests.scripts import load_script

serve_sweep = load_script("serve_sweep")
identity, markdown, parse_server = serve_sweep.identity, serve_sweep.markdown, serve_sweep.parse_server
summarize, summarize_overhead = serve_sweep.summarize, serve_sweep.summarize_overhead


def level(c: int, tok_s: float, texts: list[str | None], errors: int = 0) -> dict:
    return {"concurrency": c, "output_tokens_per_s": tok_s, "requests_per_s": tok_s / 100, "latency_p50_s": 1.0,
            "latency_p95_s": 2.0, "ttft_p50_s": 0.1, "ttft_p95_s": 0.2, "errors": errors, "requests": len(texts),
            "texts": texts}


def runs() -> list[dict]:
    """Two rounds of a main server 'a' and a reference 'b'; 'a' differs from 'b' once, in a burst."""
    return [
        {"name": "a", "round": 0, "levels": [level(1, 50.0, ["x", "y"]), level(4, 120.0, ["x", "y", "x", "Z"])]},
        {"name": "b", "round": 0, "levels": [level(1, 40.0, ["x", "y"]), level(4, 100.0, ["x", "y", "x", "y"])]},
        {"name": "b", "round": 1, "levels": [level(1, 44.0, ["x", "y"]), level(4, 110.0, ["x", "y", "x", "y"])]},
        {"name": "a", "round": 1, "levels": [level(1, 46.0, ["x", None]), level(4, 132.0, ["x", "y", "x", "y"])]},
    ]


def test_parse_server():
    spec = parse_server("fifo@1,8=blockdraft serve --port {port} --max-batch 1", (1, 2))
    assert spec.name == "fifo" and spec.concurrency == (1, 8)
    assert spec.command == ["blockdraft", "serve", "--port", "{port}", "--max-batch", "1"]
    assert parse_server("x=cmd {port}", (1, 2)).concurrency == (1, 2)
    for bad in ("no-equals", "x=", "x=cmd without port"):
        with pytest.raises(InvalidArgumentError, match="--server"):
            parse_server(bad, (1,))


def test_summary_means_rounds_and_keeps_each_round():
    table = summarize(runs())
    assert table["a"][1]["output_tokens_per_s"] == 48.0 and table["a"][1]["throughput_rounds"] == [50.0, 46.0]
    assert table["b"][4]["output_tokens_per_s"] == 105.0 and table["a"][4]["requests"] == 8


def test_identity_counts_replies_against_alone_and_the_reference():
    report = identity(runs(), "b", prompts=2)
    # a: round 0's burst has "Z" where alone said "y"; round 1's second solo reply failed, so replies to that
    # prompt in round 1 are not compared (its c=1 level counts 1 reply, its c=4 level 2)
    assert report["a"]["replies"] == 2 + 4 + 1 + 2
    assert report["a"]["same_as_alone"] == report["a"]["replies"] - 1
    assert report["a"]["same_as_reference"] == report["a"]["compared_with_reference"] - 1
    assert report["b"]["same_as_alone"] == report["b"]["replies"] == 12


def test_markdown_shows_ratios_with_the_per_round_spread():
    result = {"summary": summarize(runs()), "main": "a", "baselines": ["b"], "prompts": 2, "max_tokens": 8,
              "rounds": 2, "identity": identity(runs(), "b", 2), "overhead": summarize_overhead(pairs(), "a")}
    text = markdown(result)
    # c=4: mean 126 / 105 = 1.20; per round 120/100 = 1.20 and 132/110 = 1.20
    assert "| 4 | 126.0 | 105.0 | 1.20x (1.20-1.20) |" in text
    assert "1.14x (1.05-1.25)" in text  # c=1: 48 / 42; rounds 50/40 and 46/44
    assert "a 8/9 alone, 8/9 reference" in text
    assert "over 2 rounds: 30.0 vs 46.7 tok/s = 64.3% (per round 80.0%-100.0%); 2/3 texts identical, 1 errors" in text


def pair(r: int, ok: bool, server: tuple[int, float], direct: tuple[int, float], same: bool) -> dict:
    return {"round": r, "prompt": 0, "server_ok": ok, "server_tokens": server[0], "server_s": server[1],
            "direct_tokens": direct[0], "direct_s": direct[1], "same_text": same}


def pairs() -> list[dict]:
    """Round 0: server 80 tok/s, direct 100; round 1: both 20; a failed reply that does not count."""
    return [pair(0, True, (80, 1.0), (100, 1.0), True), pair(1, True, (100, 5.0), (40, 2.0), True),
            pair(1, False, (0, 9.0), (50, 1.0), False)]


def test_overhead_pools_tokens_over_seconds_and_drops_failed_replies():
    o = summarize_overhead(pairs(), "a")
    assert o["server_tokens_per_s"] == 30.0 and o["direct_tokens_per_s"] == round(140 / 3, 3)  # (80+100)/6, 140/3
    assert o["ratio"] == round(30 / (140 / 3), 4) and o["round_ratios"] == [0.8, 1.0]
    assert o["errors"] == 1 and o["same_text"] == 2


@pytest.mark.slow
def test_a_real_sweep_of_a_tiny_server(tmp_path, tiny_target_dir):
    data = tmp_path / "prompts.jsonl"  # short: the tiny target's context is 512 bytes
    data.write_text("".join(json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": text}]}) + "\n"
                            for i, text in enumerate(["hi", "tell me a story"])))
    serve = f"{sys.executable} -m blockdraft.cli serve --target {tiny_target_dir} --port {{port}} --max-batch 2"
    code = serve_sweep.main(["--server", f"tiny={serve}", "--server", f"fifo@1={serve} --max-batch 1",
                             "--baseline", "fifo", "--reference", "fifo", "--concurrency", "1,2", "--dataset", str(data), "--samples", "2",
                             "--max-tokens", "6", "--rounds", "2", "--overhead-rounds", "1",
                             "--direct-target", str(tiny_target_dir), "--port", "0", "--out", str(tmp_path)])
    assert code == 0
    result = json.loads((tmp_path / "sweep.json").read_text())
    assert [(r["name"], r["round"]) for r in result["runs"]] == [("tiny", 0), ("fifo", 0), ("tiny", 1), ("fifo", 1)]
    assert [len(r["levels"]) for r in result["runs"]] == [2, 1, 2, 1] and result["together"]
    assert all(lv["errors"] == 0 for r in result["runs"] for lv in r["levels"])
    starts = [lv["started"] for r in result["runs"] for lv in r["levels"]]  # epoch seconds, in the order run
    # runs: tiny r0 (c1, c2), fifo r0 (c1), tiny r1 (c1, c2), fifo r1 (c1); the order run, ABBA per level:
    # r0 c1 tiny fifo, c2 tiny; r1 c1 fifo tiny, c2 tiny
    assert starts[0] > 1.7e9 and sorted(starts) == [starts[i] for i in (0, 2, 1, 5, 3, 4)]
    assert result["identity"]["tiny"]["same_as_reference"] == result["identity"]["tiny"]["compared_with_reference"] > 0
    assert (tmp_path / "throughput.png").stat().st_size > 0 and "tiny x fifo" in (tmp_path / "sweep.md").read_text()
    over = result["overhead"]  # the main server at c=1 against Pipeline.stream on the same target, per request
    assert over["server"] == "tiny" and over["errors"] == 0 and len(over["pairs"]) == 2
    assert over["same_text"] == 2 and over["ratio"] > 0


def test_servers_up_together_alternate_each_levels_order_from_round_to_round(monkeypatch, tmp_path):
    calls = []

    @contextlib.contextmanager
    def serving(spec, port, log_path):
        calls.append(("start", spec.name, port))
        yield f"url-{spec.name}"
        calls.append(("stop", spec.name))

    def run_level(url, prompts, c, max_tokens, warmup):
        calls.append((url[4:], c, warmup))
        return level(c, 10.0, ["x"] * max(c, 2))

    monkeypatch.setattr(servers, "serving", serving)
    monkeypatch.setattr(servers, "run_level", run_level)
    specs = [parse_server("a=serve {port}", (1, 4)), parse_server("b@1=serve {port}", (1, 4)),
             parse_server("c=serve {port}", (1, 4))]
    saved = []
    runs = serve_sweep.run_together(specs, 9000, ["p", "q"], 8, 2, tmp_path, lambda r: saved.append(len(r)))
    assert calls == [("start", "a", 9000), ("start", "b", 9001), ("start", "c", 9002),
                     ("a", 1, True), ("b", 1, True), ("c", 1, True),    # round 0, level 0: in order
                     ("c", 4, False), ("a", 4, False),                  # level 1: reversed (b sweeps c=1 only)
                     ("c", 1, False), ("b", 1, False), ("a", 1, False),  # round 1: each level the other way
                     ("a", 4, False), ("c", 4, False),
                     ("stop", "c"), ("stop", "b"), ("stop", "a")]
    assert [(r["name"], r["round"], [lv["concurrency"] for lv in r["levels"]]) for r in runs] == [
        ("a", 0, [1, 4]), ("b", 0, [1]), ("c", 0, [1, 4]), ("a", 1, [1, 4]), ("b", 1, [1]), ("c", 1, [1, 4])]
    assert saved == [3, 3, 6, 6]  # after every level
    assert "ABBA per level" in markdown({**result_of(runs), "together": True})


def result_of(runs: list[dict]) -> dict:
    return {"summary": summarize(runs), "main": "a", "baselines": [], "prompts": 2, "max_tokens": 8, "rounds": 2,
            "identity": identity(runs, None, 2)}


def test_server_names_must_differ(tmp_path):
    with pytest.raises(InvalidArgumentError, match="expected each name once"):
        serve_sweep.main(["--server", "a=x {port}", "--server", "a=y {port}", "--out", str(tmp_path), "--samples", "1"])


def test_identity_skips_servers_that_have_not_run_a_level_yet():
    """Early in a round (servers up together), a server that does not sweep the first level has an empty run."""
    early = runs()[:2] + [{"name": "c", "round": 0, "levels": []}, {"name": "b", "round": 1, "levels": []}]
    report = identity(early, "b", 2)
    assert "c" not in report and report["a"]["compared_with_reference"] > 0
    assert identity([{"name": "b", "round": 0, "levels": []}] + runs()[:1], "b", 2)["a"]["compared_with_reference"] == 0
    md = markdown(result_of(early))
    assert "c" not in summarize(early) and "| a | 1 |" in md and "| c | 1 |" not in md


def fake_servers(monkeypatch, run_level) -> None:
    """Servers that need no process: a server's URL is its name, and `run_level` plays its levels."""
    @contextlib.contextmanager
    def serving(spec, port, log_path):
        yield spec.name

    monkeypatch.setattr(servers, "serving", serving)
    monkeypatch.setattr(servers, "run_level", run_level)


def test_a_server_that_goes_down_is_left_out_and_the_others_go_on(monkeypatch, tmp_path):
    ran = []

    def run_level(url, prompts, c, max_tokens, warmup):
        if url == "b" and c == 4:
            raise BlockdraftError("no OpenAI-compatible server reachable at http://127.0.0.1:9 (refused)")
        ran.append((url, c))
        return level(c, 10.0, ["x"] * max(c, 2))

    fake_servers(monkeypatch, run_level)
    specs = [parse_server("a=serve {port}", (1, 4, 8)), parse_server("b=serve {port}", (1, 4, 8))]
    runs = serve_sweep.run_together(specs, 0, ["p", "q"], 8, 2, tmp_path, lambda r: None)
    assert ("b", 8) not in ran and ran.count(("b", 1)) == 1 and ran.count(("a", 8)) == 2  # b: round 1, c=1 only
    assert runs[1]["down"].startswith("round 1, 4 clients: no OpenAI-compatible server")
    text = markdown({**result_of(runs), "runs": runs})
    assert "b stopped answering (round 1, 4 clients: no OpenAI" in text and "| a | 8 | 10.0 / 10.0 |" in text


def test_a_bad_sweep_argument_stops_the_sweep_instead_of_marking_servers_down(monkeypatch, tmp_path):
    def run_level(url, prompts, c, max_tokens, warmup):
        raise InvalidArgumentError("max_tokens 0: expected >= 1")

    fake_servers(monkeypatch, run_level)
    with pytest.raises(InvalidArgumentError, match="max_tokens 0"):
        serve_sweep.run_together([parse_server("a=serve {port}", (1,))], 0, ["p"], 0, 1, tmp_path, lambda r: None)


def test_markdown_names_the_machine():
    env = {"cpu_model": "Some Xeon", "cpu_capability": "AVX512", "cpu_count": 2, "packages": {"torch": "2.13.0"},
           "git_commit": "d46b6223b01411be6a00800e620487b3c56426a4"}
    text = markdown({**result_of(runs()), "environment": env})
    assert "\n\nMachine: Some Xeon (AVX512), 2 cores, torch 2.13.0, blockdraft at d46b622.\n\n|" in text
    assert "Machine:" not in markdown(result_of(runs()))

