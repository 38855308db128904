"""report.comparisons: a method against the best of others per buffer, with the Welch interval of the difference."""
from __future__ import annotations

import math

import pandas as pd
import pytest
from scipy import stats

from gcl.report.common import ReportError
from gcl.report.comparison import Difference, comparison_rows, comparison_section, welch_difference
from gcl.report.display import Display
from gcl.report.settings import Comparison, ReportSettings
from gcl.report.summary import ResolvedReport


def test_interval_by_hand_with_one_constant_side():
    # b is constant, so the interval is a's one-sample t interval shifted by 1: df 3, t(0.975, 3) = 3.182446
    d = welch_difference([1.0, 2.0, 3.0, 4.0], [1.0, 1.0, 1.0, 1.0])
    half = 3.182446 * math.sqrt((5 / 3) / 4)
    assert d.estimate == pytest.approx(1.5)
    assert d.df == pytest.approx(3.0)
    assert (d.low, d.high) == pytest.approx((1.5 - half, 1.5 + half), abs=1e-5)
    assert d.verdict == "not decided"      # [-0.55, +3.55]: holds 0 and reaches beyond +2


def test_interval_by_the_welch_satterthwaite_formula():
    a, b = [10.0, 11.0, 12.0], [1.0, 2.0, 3.0, 4.0, 5.0]
    va, vb = 1.0 / 3, 2.5 / 5                        # sample variance / n
    df = (va + vb) ** 2 / (va ** 2 / 2 + vb ** 2 / 4)
    half = stats.t.ppf(0.975, df) * math.sqrt(va + vb)
    d = welch_difference(a, b)
    assert d.df == pytest.approx(df)
    assert (d.estimate, d.low, d.high) == pytest.approx((8.0, 8.0 - half, 8.0 + half))
    assert d.verdict == "wins" and welch_difference(b, a).verdict == "loses"
    interval = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)   # scipy's own Welch test agrees
    assert (d.low, d.high) == pytest.approx((interval.low, interval.high))


def test_interval_needs_two_seeds_a_side_and_is_exact_for_constants():
    with pytest.raises(ValueError, match="at least 2 seeds"):
        welch_difference([1.0], [1.0, 2.0])
    d = welch_difference([3.0, 3.0], [1.0, 1.0])
    assert (d.low, d.high, d.verdict) == (2.0, 2.0, "wins")


def summary(cells: dict[tuple[str, str], list[float]]) -> pd.DataFrame:
    return pd.DataFrame([{"benchmark": "mnist-360", "method": m, "buffer": b, "seed": s, "class_il": acc}
                         for (m, b), accs in cells.items() for s, acc in enumerate(accs)])


CELLS = {("coca", "200"): [60.8, 61.0, 61.2], ("er", "200"): [50.0, 52.0, 51.0], ("clser", "200"): [61.0, 61.2, 61.4],
         ("coca", "500"): [80.0, 81.0, 82.0], ("er", "500"): [70.0, 71.0, 72.0], ("clser", "500"): [75.0, 76.0, 74.0]}


def display() -> Display:
    data = {"seeds": [0, 1, 2], "benchmarks": {"mnist-360": {"source": "mnist", "kind": "mnist-360", "has_tasks": False}},
            "methods": {"coca": {}, "er": {}, "clser": {}}, "runs": {}, "caveats": {},
            "report": {"methods": {"coca": {"label": "CoCa"}, "er": {"label": "ER"}, "clser": {"label": "CLS-ER"}}}}
    return Display(ResolvedReport.from_json(data))


def test_the_best_other_by_mean_at_each_buffer():
    spec = Comparison(benchmark="mnist-360", method="coca", against=["er", "clser"])
    rows = comparison_rows(spec, summary(CELLS))
    assert [(r.buffer, r.best, r.difference.verdict) for r in rows] == [("200", "clser", "ties"), ("500", "clser", "wins")]
    assert rows[0].difference.estimate == pytest.approx(-0.2)
    text = comparison_section(spec, summary(CELLS), display(), "###")
    assert "CoCa wins at B=500; ties at B=200." in text
    assert "| 200 " in text and "CLS-ER" in text and "61.00 ± 0.20 (3)" in text and "[" in text


def test_a_method_missing_at_a_buffer_is_refused_not_skipped():
    cells = {k: v for k, v in CELLS.items() if k != ("clser", "500")}
    spec = Comparison(benchmark="mnist-360", method="coca", against=["er", "clser"])
    with pytest.raises(ReportError, match=r"\['clser'\] have no run on mnist-360 at buffer 500"):
        comparison_rows(spec, summary(cells))


def test_comparisons_are_a_report_setting():
    settings = ReportSettings.model_validate({"comparisons": [{"benchmark": "mnist-360", "against": ["er"]}]})
    assert settings.comparisons[0].method == "coca"
    with pytest.raises(Exception):
        ReportSettings.model_validate({"comparisons": [{"benchmark": "mnist-360", "against": []}]})


def test_one_seed_a_side_shows_the_difference_and_says_an_interval_needs_two():
    one_seed = {k: v[:1] for k, v in CELLS.items()}
    spec = Comparison(benchmark="mnist-360", method="coca", against=["er", "clser"])
    rows = comparison_rows(spec, summary(one_seed))
    assert [(r.best, r.difference.estimate, r.difference.has_interval) for r in rows] == \
        [("clser", pytest.approx(-0.2), False), ("clser", 5.0, False)]
    text = comparison_section(spec, summary(one_seed), display(), "###")
    assert "| -0.20 " in text and "| +5.00 " in text
    assert "no interval (needs 2 seeds a side)" in text
    assert "CoCa is not decided at B=200 and B=500: an interval needs at least 2 seeds on each side." in text
    # one seed on one side only: still no interval, the other side's seeds shown
    mixed = {**CELLS, ("coca", "200"): [60.0], ("coca", "500"): [80.0]}
    rows = comparison_rows(spec, summary(mixed))
    assert [r.difference.verdict for r in rows] == ["no interval (needs 2 seeds a side)"] * 2
    assert "61.20 ± 0.20 (3)" in comparison_section(spec, summary(mixed), display(), "###")


@pytest.mark.parametrize("low, high, reading", [
    (-1.82, 5.59, "not decided"),   # holds 0 and allows CoCa 5.6 points ahead: not a tie, whatever the estimate
    (-2.43, 1.56, "not decided"),   # reaches 2.43 points behind
    (-1.2, 1.5, "ties"),            # the whole interval inside ±2
    (0.3, 1.5, "wins"),             # excludes 0: a win, however small
    (-5.0, -2.5, "loses"),
    (-2.0, 1.0, "not decided"),     # touching the bound is not inside it
])
def test_the_reading_is_decided_on_the_interval_never_on_the_estimate(low, high, reading):
    for estimate in (low + 0.01, (low + high) / 2, high - 0.01):   # the estimate anywhere inside: same reading
        assert Difference(estimate, low, high, 4.0).verdict == reading


def test_an_interval_holding_0_is_a_tie_only_inside_2_points():
    """-0.2 [-0.65, +0.25] is a tie; -1.0 [-3.3, +1.3] and +3.0 with intervals holding 0 are not decided: the seeds
    cannot tell a gap of more than 2 points from none; the section says which."""
    near = welch_difference([60.8, 61.0, 61.2], [61.0, 61.2, 61.4])
    assert -2 < near.low < 0 < near.high < 2 and near.verdict == "ties"
    small_but_wide = welch_difference([60.0, 61.0, 62.0], [61.0, 63.0, 62.0])
    assert small_but_wide.estimate == pytest.approx(-1.0) and small_but_wide.low < -2
    assert small_but_wide.verdict == "not decided"
    far = welch_difference([60.0, 64.0, 68.0], [61.0, 63.0, 59.0])
    assert far.low < 0 < far.high and far.estimate == pytest.approx(3.0) and far.verdict == "not decided"
    cells = {**CELLS, ("coca", "500"): [60.0, 64.0, 68.0], ("er", "500"): [50.0, 51.0, 52.0],
             ("clser", "500"): [61.0, 63.0, 59.0]}
    spec = Comparison(benchmark="mnist-360", method="coca", against=["er", "clser"])
    assert [(r.best, r.difference.verdict) for r in comparison_rows(spec, summary(cells))] == [
        ("clser", "ties"), ("clser", "not decided")]
    text = comparison_section(spec, summary(cells), display(), "###")
    assert ("CoCa ties at B=200; is not decided at B=500: the interval holds 0 and reaches beyond ±2 points"
            in text)


def test_a_candidate_not_run_at_one_buffer_is_left_out_there_only():
    """Part of a grid: CLS-ER has run at 200 but not yet at 500. At 200 the verdict is the full grid's; at 500 the
    best of those that ran, the row saying who is left out; a method that ran nowhere is never named."""
    cells = {k: v for k, v in CELLS.items() if k != ("clser", "500")}
    spec = Comparison(benchmark="mnist-360", method="coca", against=["er", "clser"])
    full = comparison_rows(spec, summary(CELLS))
    part = comparison_rows(spec, summary(cells), unrun={("mnist-360", "clser", "500")})
    assert (part[0].best, part[0].difference, part[0].left_out) == (full[0].best, full[0].difference, ())
    assert (part[1].best, part[1].left_out) == ("er", ("clser",))
    text = comparison_section(spec, summary(cells), display(), "###", unrun={("mnist-360", "clser", "500")})
    assert "Not run yet, so left out: CLS-ER at B=500." in text and "the best of ER, CLS-ER there" in text
    nowhere = {k: v for k, v in CELLS.items() if k[0] != "clser"}
    unrun = {("mnist-360", "clser", "200"), ("mnist-360", "clser", "500")}
    text = comparison_section(Comparison(benchmark="mnist-360", method="coca", against=["er", "clser"],
                                         title="CoCa against the best of ER and CLS-ER", text="CLS-ER: 3 seeds."),
                              summary(nowhere), display(), "###", unrun=unrun)
    assert "CLS-ER" not in text.split("Not run yet")[0] and "the best of ER there" in text
    # a method with no run at that buffer in params.yaml at all (not merely unfinished) is still refused
    with pytest.raises(ReportError, match=r"\['clser'\] have no run on mnist-360 at buffer 500"):
        comparison_rows(spec, summary(cells), unrun={("mnist-360", "clser", "200")})
