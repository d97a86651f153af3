"""params.yaml benchmark: the drafts benchmark.compare serves must live under drafts/ (a dependency
of the benchmark stage, so that a changed draft reruns the comparison); the undecided load's k
must be one served."""

import pytest
from pydantic import ValidationError

from draftline.benchmark.config import BenchmarkConfig


@pytest.mark.parametrize("path", ["models/draft", "/abs/drafts/x", "drafts/../models/draft", ""])
def test_a_compared_draft_outside_drafts_is_refused(path):
    with pytest.raises(ValidationError, match="is not under drafts/"):
        BenchmarkConfig(compare={"other": path})


def test_compared_drafts_under_drafts_and_their_ks():
    cfg = BenchmarkConfig(compare={"peagle": "drafts/peagle"}, k=[1, 3])
    assert cfg.compare_ks == [1, 3] and BenchmarkConfig(compare_k=[2], k=[1]).compare_ks == [2]
    with pytest.raises(ValidationError, match="compare: only for a served engine"):
        BenchmarkConfig(compare={"peagle": "drafts/peagle"}, engine="hf")


def test_undecided_k_is_zero_or_a_k_served():
    assert BenchmarkConfig(undecided_k=2).undecided_k == 2
    with pytest.raises(ValidationError, match="undecided_k: 4 is not one of k"):
        BenchmarkConfig(undecided_k=4)
