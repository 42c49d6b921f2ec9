"""The answer-accuracy evaluator builds its engine for each evaluation: an evaluation copy made anew
each time (FSDP2's whole copy) must not keep every earlier copy and its engine alive."""

from __future__ import annotations

import gc
import weakref

from test_samples import small_gpt

from portachat.device import get_device
from portachat.tokenizer import render_for_completion
from portachat.train.chat_eval import answer_accuracy_evaluator
from portachat.train.collectives import SINGLE_PROCESS


def test_an_earlier_evaluation_copy_is_released(small_tokenizer):
    convs = [{"messages": [{"role": "user", "content": "1+1?"}], "answer": "2"}]
    evaluate = answer_accuracy_evaluator(convs, small_tokenizer, lambda m: render_for_completion(small_tokenizer, m),
                                         get_device("cpu"), SINGLE_PROCESS, max_tokens=2)
    first = small_gpt(small_tokenizer.vocab_size)
    evaluate(first, 0)
    gone = weakref.ref(first)
    del first
    evaluate(small_gpt(small_tokenizer.vocab_size), 1)
    gc.collect()
    assert gone() is None
