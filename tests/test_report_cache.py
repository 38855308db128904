"""The report keeps each t-SNE embedding under a key of all it is computed from, so that after one setting's
change it recomputes only the runs whose features changed, with the very floats a fresh computation gives."""
import numpy as np
import pytest

from gcl.report import plot_data


@pytest.fixture
def counted(monkeypatch):
    """embed_tsne, counting the features it embeds."""
    calls = []
    real = plot_data.embed_tsne

    def embed(features):
        calls.append(features.shape)
        return real(features)

    monkeypatch.setattr(plot_data, "embed_tsne", embed)
    return calls


def features(seed: int, n: int = 40) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, 4)).astype(np.float32)


def test_only_changed_features_are_embedded_again(tmp_path, counted):
    a, b, c = features(0), features(1), features(2, n=41)
    first = plot_data.cached_tsne([a, b], tmp_path)
    assert len(counted) == 2 and len(list(tmp_path.glob("*.npy"))) == 2
    again = plot_data.cached_tsne([a, c], tmp_path)            # b's run changed into c
    assert counted[2:] == [(41, 4)]                             # only c embedded
    assert np.array_equal(again[0], first[0])                   # a: the kept floats
    assert len(list(tmp_path.glob("*.npy"))) == 2               # b's embedding no longer kept
    assert np.array_equal(again[0], plot_data.embed_tsne(a))    # the same as a fresh computation


def test_the_key_follows_the_features_not_where_they_come_from():
    a = features(0)
    assert plot_data.tsne_key(a) == plot_data.tsne_key(a.copy())
    assert plot_data.tsne_key(a) != plot_data.tsne_key(a[:-1])
    changed = a.copy()
    changed[0, 0] += 1e-6
    assert plot_data.tsne_key(a) != plot_data.tsne_key(changed)


def test_an_unreadable_kept_embedding_is_computed_again(tmp_path, counted):
    a = features(0)
    plot_data.cached_tsne([a], tmp_path)
    (tmp_path / f"{plot_data.tsne_key(a)}.npy").write_bytes(b"cut short")
    again = plot_data.cached_tsne([a], tmp_path)
    assert len(counted) == 2 and np.array_equal(again[0], plot_data.embed_tsne(a))


def test_a_figure_is_drawn_again_only_when_what_it_draws_changed(tmp_path, monkeypatch):
    """A benchmark's curve figure whose curves, labels and colours are those of the last report is copied from the
    cache; the other is drawn. The cache then holds what this report drew or took."""
    from gcl.report import figures
    from gcl.report.cache import Kept
    from gcl.report.display import Display
    from gcl.report.plot_data import Curve
    from gcl.report.summary import ResolvedReport

    drawn, real = [], figures._save
    monkeypatch.setattr(figures, "_save", lambda fig, path: drawn.append(path.name) or real(fig, path))
    benches = {b: {"label": b, "source": "s", "kind": "k", "has_tasks": False} for b in ("a", "b")}
    display = Display(ResolvedReport.from_json({"seeds": [0], "benchmarks": benches, "methods": {}, "runs": {},
                                                "report": {}}))
    out, cache = tmp_path / "out", tmp_path / "cache"
    out.mkdir()

    def report(b_values):
        kept = Kept(cache, ".png")
        curves = [Curve("a", "er", "200", False, [1.0, 2.0]), Curve("b", "er", "200", False, b_values)]
        figures.plot_curves(curves, {}, display, out, kept)
        kept.prune()

    report([3.0, 4.0])
    first = (out / "a-curves.png").read_bytes()
    assert drawn == ["a-curves.png", "b-curves.png"]
    report([3.0, 5.0])                                          # one run of b changed
    assert drawn[2:] == ["b-curves.png"] and (out / "a-curves.png").read_bytes() == first
    assert len(list(cache.glob("*.png"))) == 2
