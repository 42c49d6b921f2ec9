from portachat.engine.speculative.ngram import propose_ngram


def test_continues_the_latest_earlier_occurrence_of_the_longest_suffix():
    tokens = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 2, 3]
    # Suffix [2, 3] last occurred at 6..7 (followed by 7, 8, 5); [5, 2, 3] never occurred before.
    assert propose_ngram(tokens, 3, 2, 3) == [7, 8, 5]
    assert propose_ngram(tokens, 10, 2, 3) == [7, 8, 5, 2, 3]  # stops at the end of the sequence
    assert propose_ngram([4, 1, 2, 6, 1, 2, 5, 3, 1, 2], 2, 2, 4) == [5, 3]  # latest of two occurrences


def test_longer_matches_win_and_min_bounds_the_search():
    tokens = [7, 1, 2, 3, 4, 0, 2, 3, 5, 1, 2, 3]
    assert propose_ngram(tokens, 2, 1, 3) == [4, 0]  # [1, 2, 3] beats the later [2, 3]
    assert propose_ngram([1, 2, 3, 4], 2, 1, 2) == []  # nothing recurs
    assert propose_ngram([5, 6, 5], 2, 1, 2) == [6, 5]  # unigram lookup
    assert propose_ngram([5, 6, 5], 2, 2, 2) == []
    assert propose_ngram([5], 2, 1, 2) == []


def test_a_shorter_match_guesses_fewer_tokens():
    tokens = [5, 6, 7, 8, 9, 5]  # only the unigram [5] recurs
    assert propose_ngram(tokens, 3, 2, 3) == []
    assert propose_ngram(tokens, 3, 2, 3, short_tokens=1) == [6]
    assert propose_ngram(tokens, 3, 2, 3, short_tokens=2) == [6, 7]
    assert propose_ngram([1, 2, 3, 1, 2], 3, 2, 3, short_tokens=1) == [3, 1, 2]  # a full match: K tokens
    assert propose_ngram([1, 2, 3, 4], 3, 2, 3, short_tokens=1) == []  # nothing recurs at all
