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


def step_classes() -> list[type]:
    """Every class of the package that defines a step (`observe` in its own body)."""
    import importlib
    import inspect
    import pkgutil

    import gcl
    found = []
    for info in pkgutil.walk_packages(gcl.__path__, "gcl."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        found += [cls for _, cls in inspect.getmembers(module, inspect.isclass)
                  if cls.__module__ == module.__name__ and "observe" in vars(cls)]
    return found


def twice_defined(classes: list[type]) -> list[str]:
    """The classes among `classes` that define a step outside the one-definition rule: each must be a registered
    method, or a base that registered methods extend (a plug-in such as STAR)."""
    from gcl.methods.base import Method
    registered = set(METHODS.values())
    return [f"{cls.__module__}.{cls.__qualname__}" for cls in classes
            if not issubclass(cls, Method)
            or (cls not in registered and not any(issubclass(m, cls) for m in registered))]


def test_a_methods_step_is_defined_in_one_class():
    """A second class with a method's step (a stacked twin, a copy for another engine) fails here: one definition
    trains one seed or a stack (gcl.core.seeds)."""
    classes = step_classes()
    assert len(classes) >= len(METHODS) - 2          # every method but DER++ and the STAR pair defines its own
    offenders = twice_defined(classes)
    assert not offenders, f"{offenders} define a step outside a registered method: write it once, over gcl.core.seeds"


def test_a_stacked_twin_is_caught():
    from gcl.methods.base import Method
    from gcl.methods.er import ER

    class StackedER(Method):          # the old form: a second class with ER's name and step
        name = "er"

        def observe(self, x, y, x_raw):
            return ER.observe(self, x, y, x_raw)

    class Engine:                     # a step outside the contract altogether
        def observe(self, x, y, x_raw):
            pass
    assert twice_defined([ER, StackedER, Engine]) == [f"{__name__}.test_a_stacked_twin_is_caught.<locals>.StackedER",
                                                      f"{__name__}.test_a_stacked_twin_is_caught.<locals>.Engine"]
