"""scripts/serve_cycles.py: what it writes about the server's adaptive policy when the server stops."""
import importlib.util
import json
from pathlib import Path

from blockdraft.decoding.adaptive import CHAIN, DRAFTER, TREE, AdaptiveVerify

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "serve_cycles.py"


def load_script():
    spec = importlib.util.spec_from_file_location("serve_cycles", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_policy_state_names_each_batch_sizes_verdicts():
    policy = AdaptiveVerify({q: 1.0 + 0.1 * q for q in range(1, 9)})
    for _ in range(6):  # at 4 rows the drafter's cycles lose to plain ones, and its trees to its chains
        policy.cycle_done(4, None, 4, 0.1)
        policy.cycle_done(4, DRAFTER, 5, 0.2, shape=TREE)
        policy.cycle_done(4, DRAFTER, 5, 0.15, shape=CHAIN)
    state = json.loads(json.dumps(load_script().policy_state(policy)))  # as written to OUT.policy.json
    assert state["outcomes"]["4"]["without"] == ["drafter"]
    assert state["shapes"]["4"]["chains"] is True and state["shapes"]["4"]["tree"][0] > 0
