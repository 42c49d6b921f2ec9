"""Rewards for GRPO: built-ins, user functions in TRL's signature (plain and conversational), weights,
None as "does not apply", and clear errors for a missing file or function or a wrong-length result."""

from __future__ import annotations

import pytest

from portachat.train.rewards import Rewards, reward_function
from portachat.train.trainer import TrainingError

CHAT_PROMPTS = [[{"role": "user", "content": "2+2?"}]] * 3
CHAT_COMPLETIONS = [[{"role": "assistant", "content": c}] for c in ("So #### 4", "The answer is 5.", "I think 4")]


def test_builtins_score_answers_formats_and_length():
    ids = [[1] * 4, [1] * 12, [1] * 24]
    cols = {"answer": ["4", "4", "4"]}
    gsm = reward_function("gsm8k")(prompts=CHAT_PROMPTS, completions=CHAT_COMPLETIONS, completion_ids=ids, **cols)
    assert gsm == [1.0, 0.0, 1.0]  # the final number counts, "####" or not
    gsm_raw = reward_function("gsm8k")(prompts=CHAT_PROMPTS, completions=CHAT_COMPLETIONS, completion_ids=ids,
                                       answer=["... #### 4"] * 3)  # GSM8K's own answer column
    assert gsm_raw == gsm
    synthetic = reward_function("synthetic")(prompts=CHAT_PROMPTS, completions=CHAT_COMPLETIONS, completion_ids=ids,
                                             **cols)
    assert synthetic == [1.0, 0.0, 0.0]  # a stated answer only, not any number
    regex = reward_function(r"regex:^The answer is \d+\.$")(prompts=[], completions=CHAT_COMPLETIONS, completion_ids=ids)
    assert regex == [0.0, 1.0, 0.0]
    length = reward_function("length:8")(prompts=[], completions=CHAT_COMPLETIONS, completion_ids=ids)
    assert length == [0.0, -0.5, -1.0]


def test_user_function_with_trls_signature_gets_columns_and_weights(tmp_path):
    path = tmp_path / "my_rewards.py"
    path.write_text(
        "def exact(prompts, completions, answer, **kwargs):\n"
        "    texts = [c[0]['content'] if isinstance(c, list) else c for c in completions]\n"
        "    return [1.0 if t.strip().endswith(a) else 0.0 for t, a in zip(texts, answer)]\n"
        "def only_first(prompts, completions, **kwargs):\n"
        "    return [2.0] + [None] * (len(completions) - 1)\n"
    )
    rewards = Rewards([f"{path}:exact", f"{path}:only_first", "length:8"], weights=[1.0, 0.5, 2.0])
    values, applied = rewards.score(CHAT_PROMPTS, CHAT_COMPLETIONS, [[1] * 4, [1] * 12, [1] * 4],
                                  {"answer": ["4", "4", "4"]})
    assert values == [1.0 + 0.5 * 2.0, 0.0 + 2.0 * -0.5, 1.0]  # None skipped, as TRL's nansum
    assert rewards.names == ["exact", "only_first", "length:8"]
    assert applied["only_first"] == (2.0, 1) and applied["exact"] == (2.0, 3) and applied["length:8"] == (-0.5, 3)
    plain, _ = Rewards([f"{path}:exact"]).score(["2+2="] * 2, [" 4", " 5"], [[1], [1]], {"answer": ["4", "4"]})
    assert plain == [1.0, 0.0]


def test_errors_name_the_problem(tmp_path):
    with pytest.raises(TrainingError, match="no such file"):
        reward_function(str(tmp_path / "missing.py") + ":f")
    path = tmp_path / "r.py"
    path.write_text("def good(prompts, completions, **kw):\n    return [1.0]\n")
    with pytest.raises(TrainingError, match=r"has no function nope \(functions: good\)"):
        reward_function(f"{path}:nope")
    with pytest.raises(TrainingError, match="returned 1 values for 2 completions"):
        Rewards([f"{path}:good"]).score(["a", "b"], ["x", "y"], [[1], [1]], {})
    with pytest.raises(TrainingError, match="not a built-in reward"):
        reward_function("accuracy")
    with pytest.raises(TrainingError, match="one per --reward"):
        Rewards(["gsm8k", "length:4"], weights=[1.0])
    with pytest.raises(TrainingError, match="'answer' column"):
        Rewards(["gsm8k"]).score(["a"], ["4"], [[1]], {})
    with pytest.raises(TrainingError, match="not a valid regular expression"):
        reward_function("regex:(")
