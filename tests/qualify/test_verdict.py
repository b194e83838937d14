"""The marks and the verdict on hand-made figures: pays / does not pay / mismatched drafter / changed outputs."""
import copy

import pytest

from blockdraft.qualify.verdict import FAIL, PASS, WARN, sections, verdict


def _speed(rows):
    return [{"dataset": d, "temperature": t, "speedup": x} for d, t, x in rows]


BASE = {
    "settings": {"verify": "adaptive"},
    "pair": {"problems": [], "warnings": [], "greedy_tau_own": 2.4, "trained_for": "t", "target_name": "t"},
    "correctness": {
        "greedy": {"compared": 8, "identical": 8, "divergences": []},
        "seeded": {"temperature": 0.7, "compared": 6, "identical": 6},
        "sampler_test": {"sampler": "rejection", "temperature": 0.7, "samples": 400, "tokens": 3, "categories": 9,
                         "p_value": 0.4, "mean_committed_per_cycle": 2.6},
    },
    "acceptance": {"rows": [{"dataset": "humaneval", "temperature": 0.0, "tau": 3.1, "tau_own": 2.9,
                             "break_even_tau": 1.3, "verify_tokens": 6}]},
    "work": {"break_even_tau": 1.3, "predicted_speedup": 1.7, "measured_speedup": 1.6, "flops_ratio": 1.4,
             "target_tokens_per_committed": 1.5},
    "speed": {"single": _speed([("humaneval", 0.0, 1.8), ("mt-bench", 0.0, 1.5)]), "server": None},
    "memory": {"fit_with_drafter": 40, "fit_without_drafter": 41, "budget_bytes": 8 * 2**30, "context_tokens": 2048},
}


def judge(**changes):
    fig = copy.deepcopy(BASE)
    for path, value in changes.items():
        node = fig
        *head, last = path.split("__")
        for key in head:
            node = node[key]
        node[last] = value
    marks = sections(fig)
    mark, text = verdict(fig, marks)
    return {s.key: s for s in marks}, mark, text


def test_a_pair_that_pays_everywhere_passes_and_says_deploy():
    marks, mark, text = judge()
    assert mark == PASS and all(s.mark == PASS for s in marks.values())
    assert "humaneval at T=0 (1.80x)" in text and "mt-bench at T=0 (1.50x)" in text and "Deploy it." in text
    assert "40 concurrent 2048-token requests" in text


def test_a_pair_that_pays_on_code_but_not_on_hot_chat_says_where_and_to_deploy_adaptive():
    marks, mark, text = judge(speed__single=_speed([("humaneval", 0.0, 1.8), ("mt-bench", 0.7, 0.90)]))
    assert mark == WARN and marks["speed"].mark == FAIL
    assert "pays on humaneval at T=0 (1.80x)" in text and "not on mt-bench at T=0.7 (0.90x)" in text
    assert "loses at mt-bench at T=0.7 even with adaptive verify on" in text and "--no-draft" in text
    assert "measure again" not in text
    fixed = dict(BASE["settings"], verify="fixed")
    _, _, text = judge(settings=fixed, speed__single=_speed([("humaneval", 0.0, 1.8), ("mt-bench", 0.7, 0.97)]))
    assert "Deploy with adaptive verify, which falls back" in text


def test_a_pair_that_never_pays_is_left_off():
    _, mark, text = judge(speed__single=_speed([("mt-bench", 0.0, 0.98), ("mt-bench", 0.7, 1.01)]))
    assert mark == WARN and "Leave it off" in text and "does not pay on mt-bench at T=0 (0.98x)" in text
    marks, mark, _ = judge(speed__single=_speed([("mt-bench", 0.0, 0.80), ("humaneval", 0.0, 1.5)]))
    assert marks["speed"].mark == FAIL and mark == WARN  # a slow configuration: a warning on the whole


def test_the_server_rows_enter_the_verdict():
    _, _, text = judge(speed__server=[{"concurrency": 1, "speedup": 1.6}, {"concurrency": 16, "speedup": 0.90}])
    assert "Through the server it pays at concurrency 1 (1.60x), and not at concurrency 16 (0.90x)." in text
    assert "serve those loads with --no-draft" in text


def test_a_shortfall_within_a_run_s_noise_is_reported_but_does_not_turn_speculation_off():
    server = [{"concurrency": 1, "speedup": 1.6}, {"concurrency": 8, "speedup": 0.98}]
    marks, mark, text = judge(speed__server=server)
    assert mark == WARN and marks["speed"].mark == WARN  # not paying is still worth a warning
    assert "and not at concurrency 8 (0.98x)." in text and "--no-draft" not in text and "Deploy it." in text
    assert "At concurrency 8 it is within 5% of plain decoding, inside a run's noise: measure again" in text
    _, _, text = judge(speed__server=server, speed__single=_speed([("humaneval", 0.0, 1.8), ("mt-bench", 0.7, 0.90)]))
    assert "it loses at mt-bench at T=0.7 even with adaptive verify on, so serve those with --no-draft." in text
    assert "At concurrency 8 it is within 5%" in text  # a clear loss elsewhere does not make this one clear


def test_a_drafter_built_for_another_target_is_not_a_match():
    marks, mark, text = judge(pair__greedy_tau_own=1.03)
    assert marks["pair"].mark == FAIL and mark == FAIL
    assert "not a match" in text and text.startswith("Do not deploy")
    marks, _, _ = judge(pair__trained_for="another-model")
    assert marks["pair"].mark == WARN
    marks, mark, _ = judge(pair__problems=["drafter hidden_size=64 but target hidden_size=32: not a pair"])
    assert mark == FAIL


def test_an_output_that_differs_fails_the_report_unless_it_is_a_near_tie():
    div = {"dataset": "mt-bench", "prompt_id": "81", "position": 40, "logit_gap": 2.5, "near_tie": False,
           "tie_threshold": 1e-3, "context": "a", "ours": "b", "plain": "c"}
    marks, mark, text = judge(correctness__greedy={"compared": 8, "identical": 7, "divergences": [div]})
    assert marks["correctness"].mark == FAIL and mark == FAIL and text.startswith("Do not deploy")
    tie = dict(div, logit_gap=2e-5, near_tie=True)
    marks, mark, text = judge(correctness__greedy={"compared": 8, "identical": 7, "divergences": [tie]})
    assert marks["correctness"].mark == WARN and mark == WARN and "near-ties" in text


@pytest.mark.parametrize("p, expected", [(0.4, PASS), (0.005, WARN), (1e-5, FAIL)])
def test_the_sampler_test_marks_by_its_p_value(p, expected):
    marks, _, _ = judge(correctness__sampler_test={**BASE["correctness"]["sampler_test"], "p_value": p})
    assert marks["correctness"].mark == expected


def test_a_seeded_sample_that_differs_fails():
    marks, mark, _ = judge(correctness__seeded={"temperature": 0.7, "compared": 6, "identical": 5})
    assert marks["correctness"].mark == FAIL and mark == FAIL


def test_memory_and_work_marks():
    marks, mark, _ = judge(memory__fit_with_drafter=0)
    assert marks["memory"].mark == FAIL and mark == FAIL
    marks, _, _ = judge(memory__fit_with_drafter=30)  # 25% fewer requests fit
    assert marks["memory"].mark == WARN
    marks, _, _ = judge(work__predicted_speedup=2.5)  # the cost model is off by 56%
    assert marks["work"].mark == WARN
    marks, _, _ = judge(acceptance__rows=[{"dataset": "mt-bench", "temperature": 0.7, "tau": 1.1, "tau_own": 1.0,
                                           "break_even_tau": 1.3, "verify_tokens": 6}])
    assert marks["acceptance"].mark == WARN and "under its break-even 1.30 (verify of 6 tokens)" in marks[
        "acceptance"].reasons[0]


def test_each_acceptance_row_meets_the_break_even_of_its_own_cycles():
    """A hot row whose policy verifies 2 tokens needs less than the greedy rows' 6-token break-even."""
    rows = [{"dataset": "humaneval", "temperature": 0.0, "tau": 3.1, "tau_own": 2.9, "break_even_tau": 1.45,
             "verify_tokens": 6},
            {"dataset": "mt-bench", "temperature": 0.7, "tau": 1.32, "tau_own": None, "break_even_tau": 1.15,
             "verify_tokens": 2}]
    marks, _, _ = judge(acceptance__rows=rows)
    assert marks["acceptance"].mark == PASS and "of its own cycles" in marks["acceptance"].reasons[0]
    marks, _, _ = judge(acceptance__rows=[dict(rows[1], break_even_tau=None)])
    assert marks["acceptance"].mark == PASS and marks["acceptance"].reasons == ["no break-even length measured"]
