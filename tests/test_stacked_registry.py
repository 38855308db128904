"""Every method that stacks (its trains_alone None) is proven to: a stacked method is trusted only through
the float64 tests that compare each seed with its lone run (on the MLP and on the ResNet-18) and through the
test that resumes a stopped group, so registering one without them fails here (docs/extending.md, "A method")."""
import pytest

import test_stacked_resnet
import test_stacked_resume
import test_stacking
from gcl.methods import METHODS


def stacking() -> set[str]:
    return {name for name, cls in METHODS.items() if not cls.trains_alone}


@pytest.mark.parametrize("module", [test_stacking, test_stacked_resnet], ids=lambda m: m.__name__)
def test_every_stacked_method_is_in_the_float64_equivalence_tests(module):
    covered = {run.algorithm for run in module.RUNS.values()}
    missing = sorted(stacking() - covered)
    assert not missing, (f"{missing} stack (trains_alone None) but {module.__name__}.RUNS has no run of "
                         "theirs: add one, so that each seed stacked is compared with its lone run in float64")


def test_every_stacked_method_is_in_the_group_resume_test():
    test = test_stacked_resume.test_a_stopped_stacked_group_resumes_to_the_same_numbers
    [keys] = [mark.args[1] for mark in test.pytestmark if mark.name == "parametrize"]
    missing = sorted(stacking() - {test_stacking.RUNS[key].algorithm for key in keys})
    assert not missing, f"{missing} stack but a stopped group of theirs is never resumed: add them to {test.__name__}"


def test_a_method_left_out_of_the_equivalence_tests_is_caught(monkeypatch):
    """The check above fails for a stacked method that no run of the tests trains."""
    monkeypatch.setattr(METHODS["gss"], "trains_alone", None)
    with pytest.raises(AssertionError, match=r"\['gss'\] stack"):
        test_every_stacked_method_is_in_the_float64_equivalence_tests(test_stacking)
