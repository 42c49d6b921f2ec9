from __future__ import annotations

import sys

import pytest

from portachat.eval.humaneval import (
    HumanEvalProblem,
    check_completions,
    completion_code,
    evaluate_humaneval,
    program_for,
    read_humaneval,
)
from portachat.eval.sandbox import SandboxLimits

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox is Linux-only")

LIMITS = SandboxLimits(timeout_s=5.0, cpu_seconds=5)


@pytest.fixture(scope="module")
def problems(humaneval_path) -> list[HumanEvalProblem]:
    return read_humaneval(humaneval_path)


def test_reads_all_164_problems(problems):
    assert len(problems) == 164
    assert problems[0].task_id == "HumanEval/0" and problems[0].entry_point == "has_close_elements"


def test_canonical_solutions_pass_and_broken_ones_fail(problems):
    subset = problems[:4]
    results = check_completions(subset, [p.canonical_solution for p in subset], LIMITS, workers=2)
    assert [r.status for r in results] == ["passed"] * 4
    broken = [p.canonical_solution.replace("return", "return None and", 1) for p in subset]
    results = check_completions(subset, broken, LIMITS, workers=2)
    assert not any(r.passed for r in results)


@pytest.mark.slow
def test_all_164_canonical_solutions_pass_in_the_sandbox(problems):
    results = check_completions(problems, [p.canonical_solution for p in problems], LIMITS)
    failed = [(p.task_id, r.status, r.stderr[-200:]) for p, r in zip(problems, results, strict=True) if not r.passed]
    assert not failed
    assert len(results) == 164


def test_chat_replies_become_programs(problems):
    p = problems[2]  # truncate_number: return number % 1.0
    fenced = f"Here you go:\n```python\ndef {p.entry_point}(number: float) -> float:\n    return number % 1.0\n```\nDone."
    assert completion_code(p, fenced).startswith(f"def {p.entry_point}")
    body_only = "    return number % 1.0\n"
    wrong = "```python\ndef truncate_number(number):\n    return 0.5\n```"
    programs = [program_for(p, completion_code(p, r)) for r in (fenced, body_only, wrong)]
    assert all(prog.rstrip().endswith(f"check({p.entry_point})") for prog in programs)
    results = check_completions([p] * 3, [completion_code(p, r) for r in (fenced, body_only, wrong)], LIMITS)
    assert [r.passed for r in results] == [True, True, False]


def test_evaluate_humaneval_scores_a_completion_function(problems):
    subset = problems[:3]
    answers = {p.prompt: "```python\n" + p.prompt + p.canonical_solution + "```" for p in subset[:2]}

    def complete(conversations, max_tokens, temperature):
        assert temperature == 0.0
        return [answers.get(c[0]["content"], "    pass\n") for c in conversations]

    result = evaluate_humaneval(complete, subset, limits=LIMITS, workers=2)
    assert result.task == "humaneval" and result.n == 3
    assert result.value == pytest.approx(2 / 3)
    assert result.details["statuses"] == {"passed": 2, "failed": 1}


def test_a_guard_evading_fork_bomb_does_not_hurt_its_neighbours(problems):
    """A completion that gets around the Python guard (a fresh copy of the posix module) and forks
    forever runs next to correct ones: it times out, they pass, nothing is left running."""
    bomb = ("import sys\ndel sys.modules['posix']\nimport posix\nimport time\nwhile True:\n    try:\n"
            "        posix.fork()\n    except OSError:\n        time.sleep(0.001)\n")
    subset = problems[:4]
    completions = ["    " + bomb.replace("\n", "\n    ")] + [p.canonical_solution for p in subset[1:]]
    results = check_completions(subset, completions, SandboxLimits(timeout_s=3.0, cpu_seconds=3), workers=2)
    assert [r.status for r in results] == ["timeout", "passed", "passed", "passed"]
