"""The greedy acceptance rule (engine/spec/acceptance.py)."""
import pytest

from hybrid_serve.engine.spec import greedy_accepted_length


@pytest.mark.parametrize("drafts, targets, accepted", [
    ([], [7], 0),  # no drafts: a plain decode step
    ([4, 5, 6, 7], [4, 5, 9, 1, 2], 2),  # d3 differs: keep d1 d2, output 4 5 9
    ([4, 5, 6], [4, 5, 6, 8], 3),  # all accepted, plus the bonus token
    ([3, 5], [4, 5, 6], 0),  # the first differs: only the target's own token
])
def test_greedy_accepted_length(drafts, targets, accepted):
    assert greedy_accepted_length(drafts, targets) == accepted
    output = targets[: accepted + 1]
    assert output[:accepted] == drafts[:accepted]


def test_target_length_must_be_one_more():
    with pytest.raises(ValueError, match="2 drafts need 3 target tokens"):
        greedy_accepted_length([1, 2], [1, 2])
