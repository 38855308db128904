"""gcl.tune (python -m gcl.tune): a grid over a run's settings, scored on a held-out validation split."""
from __future__ import annotations

import pandas as pd
import pytest
import torch

from gcl import tune
from gcl.core.atomic import save_tensors
from image_fixtures import labelled_source as source
from image_fixtures import write_er_params


def test_grid_items_parse_as_yaml_scalars():
    assert tune.parse_grid(["lr=0.1,0.2", "scl=true,false", "pretext=paper"]) == {
        "lr": [0.1, 0.2], "scl": [True, False], "pretext": ["paper"]}
    with pytest.raises(SystemExit, match="key=value"):
        tune.parse_grid(["lr"])


def test_every_point_and_seed_is_scored_on_the_validation_split(tmp_path, monkeypatch, capsys):
    write_er_params(tmp_path)
    save_tensors(tmp_path / "data" / "raw" / "mnist-bundled" / "data.pt", source(per_class=10))
    monkeypatch.chdir(tmp_path)
    rows = tune.main(["seq-er-50", "--grid", "lr=0.05,0.1", "replay_batch=4", "--seeds", "0", "1", "--workers", "2",
                      "--out", str(tmp_path / "scores.csv")])
    assert sorted(r["lr"] for r in rows) == [0.05, 0.1] and all(r["replay_batch"] == 4 for r in rows)
    assert all(len(r["per seed"].split()) == 2 and 0 <= r["val Class-IL mean"] <= 100 for r in rows)
    assert rows[0]["val Class-IL mean"] >= rows[1]["val Class-IL mean"]          # best first
    assert not (tmp_path / "runs").exists()
    scores = pd.read_csv(tmp_path / "scores.csv")      # every point and seed, the means as printed
    assert len(scores) == 4 and set(scores["seed"]) == {0, 1} and set(scores["run"]) == {"seq-er-50"}
    for r in rows:
        assert scores[scores["lr"] == r["lr"]]["val_class_il"].mean() == pytest.approx(r["val Class-IL mean"])
    til = tune.main(["seq-er-50", "--grid", "lr=0.1", "--seeds", "0", "--workers", "1", "--metric", "task_il"])
    assert til[0]["val Task-IL mean"] >= 50.0
    # a malformed point stops before any training, naming the key
    with pytest.raises(Exception, match="runs.seq-er-50.lr"):
        tune.main(["seq-er-50", "--grid", "lr=fast"])
    torch.set_num_threads(1)


def test_a_grid_with_out_resumes_from_the_scores_it_kept_and_retrains_stale_ones(tmp_path, monkeypatch, capsys):
    """Each score is written as it finishes; a later call reuses those whose settings and code are unchanged (a score
    edited in the file shows which were reused: training would give the measured one back)."""
    import yaml
    params = write_er_params(tmp_path)
    save_tensors(tmp_path / "data" / "raw" / "mnist-bundled" / "data.pt", source(per_class=10))
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "scores.csv"
    tune.main(["seq-er-50", "--grid", "lr=0.05,0.1", "--seeds", "0", "--workers", "1", "--out", str(out)])
    kept = pd.read_csv(out)
    assert len(kept) == 2 and kept["fingerprint"].nunique() == 2 and not (tmp_path / "scores.csv.tmp").exists()
    kept["val_class_il"] = [99.25, 98.75]                        # marks: a reused score comes back as marked
    kept.to_csv(out, index=False)
    again = tune.main(["seq-er-50", "--grid", "lr=0.05,0.1", "--seeds", "0", "1", "--workers", "1", "--out", str(out)])
    assert "reused 2 score(s)" in capsys.readouterr().out
    marks = {r["lr"]: r["per seed"].split()[0] for r in again}
    assert marks == {0.05: "99.25", 0.1: "98.75"}              # seed 0 reused, seed 1 trained
    assert len(pd.read_csv(out)) == 4 and all(r["per seed"].split()[1] not in ("99.25", "98.75") for r in again)
    params["runs"]["seq-er-50"]["replay_batch"] = 4           # another setting: every earlier score is stale
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    stale = tune.main(["seq-er-50", "--grid", "lr=0.1", "--seeds", "0", "--workers", "1", "--out", str(out)])
    assert "reused" not in capsys.readouterr().out and stale[0]["per seed"] != "98.75"
    with pytest.raises(SystemExit, match="holds other scores"):
        tune.main(["seq-er-50", "--grid", "lr=0.1", "--seeds", "0", "--metric", "task_il", "--out", str(out)])


def test_two_narrower_grids_merge_into_one_out_file(tmp_path, monkeypatch):
    """A grid of 4 rows, then a narrower grid on the same file: the rows of the other points stay; a third grid adds
    a new point beside them. No grid erases another's scores."""
    write_er_params(tmp_path)
    save_tensors(tmp_path / "data" / "raw" / "mnist-bundled" / "data.pt", source(per_class=10))
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "scores.csv"
    tune.main(["seq-er-50", "--grid", "lr=0.05,0.1", "--seeds", "0", "1", "--workers", "1", "--out", str(out)])
    first = pd.read_csv(out)
    assert len(first) == 4
    tune.main(["seq-er-50", "--grid", "lr=0.1", "--seeds", "0", "--workers", "1", "--out", str(out)])
    after = pd.read_csv(out)
    assert len(after) == 4 and set(zip(after["lr"], after["seed"])) == {(0.05, 0), (0.05, 1), (0.1, 0), (0.1, 1)}
    pd.testing.assert_frame_equal(after.sort_values(["lr", "seed"]).reset_index(drop=True),
                                  first.sort_values(["lr", "seed"]).reset_index(drop=True))
    tune.main(["seq-er-50", "--grid", "lr=0.2", "replay_batch=4", "--seeds", "1", "--workers", "1", "--out", str(out)])
    merged = pd.read_csv(out)
    assert len(merged) == 5 and merged["fingerprint"].nunique() == 3
    assert merged[merged["lr"] == 0.2]["replay_batch"].tolist() == [4] and merged["replay_batch"].isna().sum() == 4
    torch.set_num_threads(1)


class Stopped(Exception):
    """Stands in for a killed worker."""


def test_a_seed_stopped_mid_stream_resumes_from_its_checkpoint_to_the_same_score(tmp_path, monkeypatch, capfd):
    """The grid stops while a seed trains (after its first task's checkpoint); the next call resumes that seed from
    the checkpoint beside --out and scores what an uninterrupted grid scores; the checkpoint then goes."""
    from gcl.methods import METHODS
    write_er_params(tmp_path)
    save_tensors(tmp_path / "data" / "raw" / "mnist-bundled" / "data.pt", source(per_class=10))
    monkeypatch.chdir(tmp_path)
    grid = ["seq-er-50", "--grid", "lr=0.1", "--seeds", "0", "--workers", "1"]
    plain = tune.main([*grid, "--out", str(tmp_path / "plain.csv")])
    out = tmp_path / "scores.csv"
    original, calls = METHODS["er"].observe, [0]

    def observe(self, *args):      # the fork-started worker inherits this: it stops in the stream's third task
        if calls[0] == 6:
            raise Stopped
        calls[0] += 1
        return original(self, *args)

    with monkeypatch.context() as m:
        m.setattr(METHODS["er"], "observe", observe)
        with pytest.raises(Stopped):
            tune.main([*grid, "--out", str(out)])
    assert not out.exists() and len(list((tmp_path / "scores.csv.progress").glob("*-seed-0.ckpt"))) == 1
    capfd.readouterr()
    resumed = tune.main([*grid, "--out", str(out)])
    assert "resumed from" in capfd.readouterr().out
    assert resumed[0]["per seed"] == plain[0]["per seed"]
    assert pd.read_csv(out)["val_class_il"].tolist() == pd.read_csv(tmp_path / "plain.csv")["val_class_il"].tolist()
    assert not (tmp_path / "scores.csv.progress").exists()
    torch.set_num_threads(1)
