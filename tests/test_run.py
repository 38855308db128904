"""A run: every seed, mean and std, the same numbers whether seeds run in one process or several."""
import json
from pathlib import Path

import pytest

from gcl.core.atomic import save_tensors
from gcl.core.progress_files import PROGRESS_DIR
from gcl.training.run import train_run
from helpers import small_er_run
from test_stacked import stack_independent_kernels


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return small_er_run([0, 1, 2])


@pytest.mark.slow
def test_parallel_seeds_give_the_same_numbers(project):
    serial = json.loads(train_run(project).read_text())
    parallel = json.loads(train_run(project, workers=2).read_text())
    for seed in ("0", "1", "2"):
        assert serial["seeds"][seed]["acc_matrix"] == parallel["seeds"][seed]["acc_matrix"]
    assert list(parallel["seeds"]) == ["0", "1", "2"]
    assert serial["mean"] == parallel["mean"] and serial["std"]["class_il"] > 0


@pytest.mark.slow
def test_seeds_trained_through_the_spawn_pool_give_the_same_numbers(project, monkeypatch):
    """The pool a GPU's seed workers use (spawn: fresh interpreters, the run's settings and log sent to them),
    exercised on the CPU, where the numbers must equal those of one process."""
    import gcl.training.run as run_module
    serial = json.loads(train_run(project).read_text())
    monkeypatch.setattr(run_module, "pool_start_method", lambda device_type: "spawn")
    spawned = json.loads(train_run(project, workers=2).read_text())
    assert spawned["workers"] == 2
    for seed in ("0", "1", "2"):
        assert spawned["seeds"][seed]["acc_matrix"] == serial["seeds"][seed]["acc_matrix"]


@pytest.mark.slow
def test_an_interrupted_run_resumes_with_its_finished_seeds(project, monkeypatch):
    first = json.loads(train_run(project).read_text())
    calls = interrupted_at_seed_2(project, monkeypatch)
    assert len(list((PROGRESS_DIR / "er-50").glob("seed-*.json"))) == 2
    resumed = json.loads(train_run(project).read_text())
    assert calls == [2]                                 # seeds 0 and 1 were not trained again
    assert resumed["mean"] == first["mean"]
    assert not (PROGRESS_DIR / "er-50").exists()        # cleared once the run is complete


@pytest.mark.slow
def test_seeds_finished_eager_are_not_reused_by_a_compiled_attempt(project, monkeypatch):
    """`compile: auto` resolves per machine (a GPU with Triton compiles): seeds finished eagerly are not taken
    into an attempt that compiles, nor its checkpoints."""
    import gcl.training.run as run_module
    from gcl.core import backbones
    calls = interrupted_at_seed_2(project, monkeypatch)
    monkeypatch.setattr(run_module, "compile_mode", lambda setting, device, method_cls: "reduce-overhead")
    monkeypatch.setattr(backbones, "compile_extractor", lambda fn, mode: fn)   # a stand-in compiler: no GPU here
    backbones.compiled_extract.cache_clear()
    try:
        out = json.loads(train_run(project).read_text())   # the stand-in trains as eager: only the decision differs
    finally:
        backbones.compiled_extract.cache_clear()
    assert calls == [0, 1, 2]
    # the run's one decision reached every seed, which applied it and says so
    assert {seed["environment"]["compiled"] for seed in out["seeds"].values()} == {"reduce-overhead"}


def interrupt_at_call(monkeypatch, cls, call: int):
    """Make `cls.observe` raise KeyboardInterrupt at its `call`-th call (1-based, counted over every seed), as a kill
    would stop the stage there; returns the original `observe`."""
    original, calls = cls.observe, [0]

    def observe(self, *args):
        calls[0] += 1
        if calls[0] == call:
            raise KeyboardInterrupt
        return original(self, *args)

    monkeypatch.setattr(cls, "observe", observe)
    return original


@pytest.mark.slow
def test_a_run_stopped_inside_a_seed_resumes_from_its_checkpoint(project, monkeypatch):
    """The stage is stopped in the middle of seed 1; run again, it reuses seed 0, resumes seed 1 from its last
    checkpoint, and ends with the numbers of a run that never stopped. The checkpoints go once the run is done."""
    from gcl.methods.er import ER
    whole = json.loads(train_run(project).read_text())
    steps = whole["seeds"]["0"]["steps"]
    original = interrupt_at_call(monkeypatch, ER, steps + 71)   # seed 0 is done; seed 1 stops at its step 70 (0-based)
    with pytest.raises(KeyboardInterrupt):
        train_run(project, checkpoint_minutes=1e-9)       # a checkpoint after every step
    assert (PROGRESS_DIR / "er-50" / "seed-1.ckpt").exists()
    assert not (PROGRESS_DIR / "er-50" / "seed-0.ckpt").exists()   # seed 0 finished: its checkpoint went
    monkeypatch.setattr(ER, "observe", original)
    out = train_run(project, checkpoint_minutes=1e-9)
    resumed = json.loads(out.read_text())
    for seed in ("0", "1", "2"):
        a, b = whole["seeds"][seed], resumed["seeds"][seed]
        assert a["acc_matrix"] == b["acc_matrix"] and a["loss_curve"] == b["loss_curve"]
        assert a["confusion"] == b["confusion"]
    log = (out.parent / "train.log").read_text()
    assert "[er-50 seed 0] finished by an earlier attempt" in log
    assert f"[er-50 seed 1] resumed from .gcl-progress/er-50/seed-1.ckpt at step 70 of {steps}" in log
    assert not (PROGRESS_DIR / "er-50").exists()


def interrupted_at_seed_2(project, monkeypatch, workers: int = 1) -> list[int]:
    """Train seeds 0 and 1, stop at seed 2 (in `workers` processes); return the list the later jobs that train a seed
    alone append their seed to."""
    import gcl.training.run as run_module
    original, calls = run_module.train_seeds, []

    def stop_at_seed_2(*args, **kw):
        if args[3] == [2] and not stacked_job(args):
            raise KeyboardInterrupt
        return original(*args, **kw)

    monkeypatch.setattr(run_module, "train_seeds", stop_at_seed_2)
    with pytest.raises(KeyboardInterrupt):
        train_run(project, workers=workers)
    monkeypatch.setattr(run_module, "train_seeds", recording_alone(original, calls))
    return calls


def stacked_job(args: tuple) -> bool:
    """Whether a call of train_seeds (as gcl.training.run makes it, every argument positional) trains a stacked group."""
    return len(args) > 9 and args[9]


def recording_alone(function, calls: list):
    """train_seeds, appending the seed of each job that trains one seed alone to `calls` first."""
    def recorded(*args, **kwargs):
        if not stacked_job(args):
            calls.extend(args[3])
        return function(*args, **kwargs)
    return recorded


@pytest.mark.slow
def test_a_truncated_seed_result_is_refused_and_the_seed_trains_again(project, monkeypatch):
    whole = json.loads(train_run(project).read_text())
    calls = interrupted_at_seed_2(project, monkeypatch)
    seed_1 = next((PROGRESS_DIR / "er-50").glob("seed-1-*.json"))
    seed_1.write_text(seed_1.read_text()[:40])          # a full disk cut it short
    out = train_run(project)
    assert calls == [1, 2]
    assert json.loads(out.read_text())["mean"] == whole["mean"]
    assert f"{seed_1} refused: it cannot be read (JSONDecodeError" in (out.parent / "train.log").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["foreign", "truncated"])
def test_features_of_another_attempt_are_refused_and_the_first_seed_trains_again(project, monkeypatch, damage):
    """The t-SNE input must be the first seed's of these settings: a features.pt left by an attempt with other
    settings (or cut short) is not shipped; seed 0 trains again and writes its own."""
    import torch
    whole = train_run(project)
    reference = torch.load(whole.parent / "features.pt", weights_only=True)
    calls = interrupted_at_seed_2(project, monkeypatch)
    features = PROGRESS_DIR / "er-50" / "features.pt"
    if damage == "foreign":
        save_tensors(features, {**torch.load(features, weights_only=True), "fingerprint": "another-attempt",
                                "features": torch.zeros(3, 4)})
    else:
        features.write_bytes(features.read_bytes()[:100])
    out = train_run(project)
    assert calls == [0, 2]
    shipped = torch.load(out.parent / "features.pt", weights_only=True)
    assert torch.equal(shipped["features"], reference["features"])
    assert "features.pt refused" in (out.parent / "train.log").read_text()


def test_a_failed_metrics_write_keeps_every_seed_for_the_rerun(project, monkeypatch):
    import gcl.training.run as run_module
    original = run_module.write_json

    def disk_full(path, obj):
        if str(path).endswith("metrics.json"):
            raise OSError(28, "No space left on device")
        return original(path, obj)

    monkeypatch.setattr(run_module, "write_json", disk_full)
    with pytest.raises(OSError):
        train_run(project)
    assert (PROGRESS_DIR / "er-50" / "features.pt").exists()
    assert len(list((PROGRESS_DIR / "er-50").glob("seed-*.json"))) == 3
    monkeypatch.setattr(run_module, "write_json", original)
    calls = []
    monkeypatch.setattr(run_module, "train_seeds", recording_alone(run_module.train_seeds, calls))
    out = train_run(project)
    assert calls == [] and (out.parent / "features.pt").exists()


def _compile_threads() -> str | None:
    import os
    return os.environ.get("TORCHINDUCTOR_COMPILE_THREADS")


@pytest.mark.slow
def test_seed_workers_share_the_cores_for_kernel_compilation(monkeypatch):
    """Each of several seed workers compiles kernels with its share of the cores, unless the user set a number."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from gcl.training.run import start_worker
    monkeypatch.delenv("TORCHINDUCTOR_COMPILE_THREADS", raising=False)
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=context, initializer=start_worker, initargs=(3,)) as pool:
        assert pool.submit(_compile_threads).result() == "3"
    monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "5")
    with ProcessPoolExecutor(1, mp_context=context, initializer=start_worker, initargs=(3,)) as pool:
        assert pool.submit(_compile_threads).result() == "5"


@pytest.fixture
def four_cores(tmp_path, monkeypatch):
    """Room for two stacked groups (or three lone seeds) on any machine."""
    from gcl.core import devices
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(devices, "available_cores", lambda: 4)


@pytest.fixture
def stacked_project(four_cores):
    return small_er_run([0, 1, 2], stack=True)


@pytest.mark.slow
@stack_independent_kernels
def test_a_stacked_run_gives_the_same_numbers_however_its_seeds_are_grouped(stacked_project):
    """`stack: true` trains ER's seeds as one network per worker: one group of three, or groups of two and one in
    two processes, give every seed the same numbers; each seed records that it was stacked."""
    one = json.loads(train_run(stacked_project).read_text())
    two = json.loads(train_run(stacked_project, workers=2).read_text())
    assert {s["environment"]["stacked"] for s in one["seeds"].values()} == {3}
    assert [two["seeds"][s]["environment"]["stacked"] for s in ("0", "1", "2")] == [2, 2, 1]
    for seed in ("0", "1", "2"):
        assert one["seeds"][seed]["acc_matrix"] == two["seeds"][seed]["acc_matrix"]
        assert one["seeds"][seed]["loss_curve"] == two["seeds"][seed]["loss_curve"]
    assert not (PROGRESS_DIR / "er-50").exists()
    log = Path("runs/mnist-360/er/50/train.log").read_text()
    assert "seeds [0, 1] train stacked" in log and "seeds [2] train stacked" in log


class StopInSecondGroup(RuntimeError):
    pass


@pytest.mark.slow
def test_an_interrupted_stacked_run_resumes_with_its_finished_group(stacked_project, monkeypatch):
    """A stacked run stopped in its second group (seed 2) keeps the first group's seeds and trains the second
    again: the numbers of a run that never stopped."""
    import gcl.training.run as run_module
    whole = json.loads(train_run(stacked_project, workers=2).read_text())
    original = run_module.train_seeds

    def stop_in_second_group(bench, training, run, seeds, *args, **kw):
        Path(f"trained-{'-'.join(map(str, seeds))}").touch()     # seen from the worker processes too
        if seeds == [2] and not Path("resume").exists():
            raise StopInSecondGroup("stopped")
        return original(bench, training, run, seeds, *args, **kw)

    monkeypatch.setattr(run_module, "train_seeds", stop_in_second_group)
    with pytest.raises(StopInSecondGroup):
        train_run(stacked_project, workers=2)
    assert len(list((PROGRESS_DIR / "er-50").glob("seed-*.json"))) == 2
    for marker in Path(".").glob("trained-*"):
        marker.unlink()
    Path("resume").touch()
    resumed = json.loads(train_run(stacked_project, workers=2).read_text())
    assert sorted(p.name for p in Path(".").glob("trained-*")) == ["trained-2"]   # the first group was reused
    for seed in ("0", "1", "2"):
        assert resumed["seeds"][seed]["acc_matrix"] == whole["seeds"][seed]["acc_matrix"]


def stacked_sizes(result: dict) -> list[int | None]:
    """How many seeds each seed of a run's metrics.json trained stacked with (None: alone)."""
    return [seed["environment"].get("stacked") for seed in result["seeds"].values()]


@pytest.mark.slow
def test_stack_auto_makes_no_stack_of_one(four_cores):
    """`stack: auto` stacks where it batches something: with a process for each seed (workers 3, or `auto`, on 4 cores)
    every seed trains alone, and with 2 workers the seed a group of one would hold trains alone, recorded as alone,
    the log saying why. (Stacks of one used to be made, and marked stacked, batching nothing.)"""
    project = small_er_run([0, 1, 2], stack="auto")
    assert stacked_sizes(json.loads(train_run(project, workers=3).read_text())) == [None, None, None]
    log = Path("runs/mnist-360/er/50/train.log").read_text()
    assert "seed(s) [0, 1, 2] train alone: stack: auto makes no stack of one (3 seeds in 3 process(es)" in log
    assert stacked_sizes(json.loads(train_run(project, workers="auto").read_text())) == [None, None, None]
    assert stacked_sizes(json.loads(train_run(project, workers=2).read_text())) == [2, 2, None]
    log = Path("runs/mnist-360/er/50/train.log").read_text()
    assert "seeds [0, 1] train stacked" in log and "seed(s) [2] train alone: stack: auto makes no stack of one" in log


def test_seeds_finished_alone_are_not_taken_into_a_stacked_attempt(four_cores, monkeypatch):
    """Whether a seed trained stacked is part of its fingerprint (stacked, it rounds otherwise): seeds 0 and 1,
    finished alone by an attempt in three processes (stack: auto makes no stack of one), train again when the next
    attempt, in one process, stacks all three, though every setting is the same."""
    project = small_er_run([0, 1, 2], stack="auto")
    monkeypatch.setattr(run_module(), "train_seeds", recording(run_module().train_seeds, stacked_calls := []))
    calls = interrupted_at_seed_2(project, monkeypatch, workers=3)
    assert len(list((PROGRESS_DIR / "er-50").glob("seed-*.json"))) == 2 and stacked_calls == []
    out = json.loads(train_run(project, workers=1).read_text())
    assert calls == [] and stacked_calls == [[0, 1, 2]]
    assert stacked_sizes(out) == [3, 3, 3]
    assert "finished by an earlier attempt" not in Path("runs/mnist-360/er/50/train.log").read_text()


def test_a_run_that_compiles_trains_its_seeds_alone_and_says_so(four_cores, monkeypatch):
    """`compile: auto` compiles a run on a GPU, and compiled seeds do not stack: the run's seeds train alone, and its
    log says so rather than leaving `stack` silently unheeded."""
    from gcl.core import backbones
    monkeypatch.setattr(run_module(), "compile_mode", lambda setting, device, method_cls: "reduce-overhead")
    monkeypatch.setattr(backbones, "compile_extractor", lambda fn, mode: fn)   # a stand-in compiler: no GPU here
    backbones.compiled_extract.cache_clear()
    try:
        out = json.loads(train_run(small_er_run([0, 1, 2], stack="auto")).read_text())
    finally:
        backbones.compiled_extract.cache_clear()
    assert stacked_sizes(out) == [None, None, None]
    assert "seeds train alone: compile: auto compiles this run (reduce-overhead), and compiled seeds do not stack" in \
        Path("runs/mnist-360/er/50/train.log").read_text()


def run_module():
    import gcl.training.run as module
    return module


def recording(function, calls: list):
    """train_seeds, appending the seeds of each stacked job (its fourth argument) to `calls` first."""
    def recorded(*args, **kwargs):
        if stacked_job(args):
            calls.append(list(args[3]))
        return function(*args, **kwargs)
    return recorded


@pytest.mark.slow
def test_a_stacked_group_stopped_mid_stream_resumes_from_its_checkpoint(stacked_project, monkeypatch):
    """A stacked group (one process, seeds 0-2) stopped at its step 70 resumes from its group checkpoint, not from
    the beginning, to the numbers of a run that never stopped; the checkpoint goes once the run is done."""
    from gcl.methods.er import ER
    whole = json.loads(train_run(stacked_project).read_text())
    original = interrupt_at_call(monkeypatch, ER, 71)
    with pytest.raises(KeyboardInterrupt):
        train_run(stacked_project, checkpoint_minutes=1e-9)      # a checkpoint after every step
    assert (PROGRESS_DIR / "er-50" / "group-0-1-2.ckpt").exists()
    monkeypatch.setattr(ER, "observe", original)
    out = train_run(stacked_project, checkpoint_minutes=1e-9)
    resumed = json.loads(out.read_text())
    for seed in ("0", "1", "2"):
        a, b = whole["seeds"][seed], resumed["seeds"][seed]
        assert a["acc_matrix"] == b["acc_matrix"] and a["loss_curve"] == b["loss_curve"]
        assert a["confusion"] == b["confusion"] and b["environment"]["stacked"] == 3
    steps = whole["seeds"]["0"]["steps"]
    log = (out.parent / "train.log").read_text()
    assert f"seeds [0, 1, 2] resumed from .gcl-progress/er-50/group-0-1-2.ckpt at step 70 of {steps}" in log
    assert not (PROGRESS_DIR / "er-50").exists()
