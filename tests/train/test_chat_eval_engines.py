"""The answer-accuracy evaluator keeps one engine per model it still evaluates: an evaluation copy
made anew each time (FSDP2's whole copy) must not keep every earlier copy and its engine alive."""

from __future__ import annotations

import gc
import weakref

from test_samples import small_gpt

from portachat.device import get_device
from portachat.train.chat_eval import answer_accuracy_evaluator


def test_an_earlier_evaluation_copy_is_released(small_tokenizer):
    convs = [{"messages": [{"role": "user", "content": "1+1?"}], "answer": "2"}]
    evaluate = answer_accuracy_evaluator(convs, small_tokenizer, get_device("cpu"), max_tokens=2)
    first = small_gpt(small_tokenizer.vocab_size)
    evaluate(first, 0)
    gone = weakref.ref(first)
    del first
    evaluate(small_gpt(small_tokenizer.vocab_size), 1)
    gc.collect()
    assert gone() is None
