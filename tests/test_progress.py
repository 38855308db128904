"""Progress lines: what a line says, where the stream stands, and the run's log beside its results."""
import json
import re
from types import SimpleNamespace

import torch

from gcl.training.progress import Progress, StreamProgress, clock
from gcl.training.train import run_seed
from helpers import run_settings

CPU = torch.device("cpu")
LINE = re.compile(r"^\[(?P<run>[\w-]+) seed (?P<seed>\d+)\] (?P<where>task \d+/\d+, epoch \d+/\d+|segment \d+/\d+), "
                  r"step (?P<step>\d+)/(?P<steps>\d+), (?P<rate>\d+) samples/s, elapsed \d+:\d\d:\d\d, "
                  r"left \d+:\d\d:\d\d, last accuracy (?P<acc>\d+\.\d\d|-)$")


def test_clock():
    assert clock(0) == "0:00:00" and clock(59.6) == "0:01:00" and clock(3 * 3600 + 62) == "3:01:02"


def test_position_names_task_and_epoch():
    # 2 tasks, 3 epochs each, 4 steps per epoch: task 1 is steps 0-11, task 2 steps 12-23
    stream = SimpleNamespace(task_ends=[11, 23], eval_after=[11, 23], steps=24, bounds=list(range(0, 25 * 4, 4)))
    p = StreamProgress(Progress("r", seed=0), stream, has_tasks=True, epochs=3, start_step=0)
    assert p.position(0) == "task 1/2, epoch 1/3"
    assert p.position(4) == "task 1/2, epoch 2/3" and p.position(11) == "task 1/2, epoch 3/3"
    assert p.position(12) == "task 2/2, epoch 1/3" and p.position(23) == "task 2/2, epoch 3/3"
    gcl = StreamProgress(Progress("r", seed=0), SimpleNamespace(task_ends=[], eval_after=[9, 19], steps=20,
                                                                bounds=list(range(21))), False, 1, 0)
    assert gcl.position(3) == "segment 1/2" and gcl.position(10) == "segment 2/2"


def test_a_seed_prints_whole_lines_with_every_field(tiny_mnist360, tmp_path, capsys):
    bench, cfg = tiny_mnist360
    run = run_settings("er", buffer=50, lr=0.1, batch=4, replay_batch=8)
    log = tmp_path / "train.log"
    result = run_seed(bench, cfg, run, 3, CPU, progress=Progress("mnist-360-er-50", log, seed=3, every=0.0))
    lines = capsys.readouterr().out.splitlines()
    assert lines == log.read_text().splitlines()       # the log holds exactly what was printed
    parsed = [LINE.match(line) for line in lines]
    assert all(parsed), [line for line, m in zip(lines, parsed) if not m]
    assert len(lines) == result.steps                 # every=0: one line per step
    last = parsed[-1]
    assert last["run"] == "mnist-360-er-50" and last["seed"] == "3" and last["where"] == "segment 27/27"
    assert int(last["step"]) == int(last["steps"]) == result.steps and int(last["rate"]) > 0
    assert float(last["acc"]) == round(result.class_il, 2)
    assert parsed[0]["acc"] == "-"                      # nothing evaluated yet after the first step


def test_a_run_writes_its_log_beside_its_results(tmp_path, monkeypatch):
    from gcl.config import resolve_run
    from gcl.core.atomic import save_tensors
    from gcl.data import sequential
    from gcl.training.run import train_run
    from helpers import synthetic_source
    monkeypatch.chdir(tmp_path)
    params = {"seeds": [0, 1], "device": "cpu", "sources": {"s": {}},
              "benchmarks": {"seq": {"kind": "sequential", "source": "s", "backbone": "mlp", "epochs": 1,
                                     "n_tasks": 5, "classes_per_task": 2, "augment": False}},
              "methods": {"er": {}},
              "runs": {"seq-er-20": {"benchmark": "seq", "method": "er", "buffer": 20, "lr": 0.1, "batch": 4,
                                     "replay_batch": 4}}}
    spec = resolve_run(params, "seq-er-20")
    bench = sequential.build_benchmark(synthetic_source(per_class=8), spec.data)
    bench["config"] = spec.data.model_dump(mode="json")
    save_tensors("data/benchmarks/seq/benchmark.pt", bench)
    out = train_run(spec, workers=2)
    lines = (out.parent / "train.log").read_text().splitlines()
    assert lines[0] == "[seq-er-20] 2 seed(s) to train on cpu, 2 process(es)"
    metrics = json.loads(out.read_text())
    for seed in (0, 1):
        mine = [line for line in lines if line.startswith(f"[seq-er-20 seed {seed}] ")]
        # five task ends, then the result; the two workers' lines never cut into each other
        assert [LINE.match(line)["where"] for line in mine[:5]] == [f"task {t}/5, epoch 1/1" for t in range(1, 6)]
        assert mine[5].startswith(f"[seq-er-20 seed {seed}] done: class-il {metrics['seeds'][str(seed)]['class_il']:.2f}")


def test_progress_of_finished_runs_is_swept_unless_their_settings_changed_or_they_train(tmp_path, monkeypatch):
    """After a kill, `dvc repro` may restore a run's output from its run cache instead of training it: the
    report stage then deletes that run's progress folder and lock, but never one whose metrics.json holds
    other settings (it may hold progress towards the current ones) or one a process is training."""
    from gcl.core.atomic import write_json
    from gcl.core.layout import run_dir
    from gcl.core.processes import RunLock
    from gcl.core.progress_files import PROGRESS_DIR, sweep_finished_progress

    monkeypatch.chdir(tmp_path)
    runs = {f"m-er-{b}": {"benchmark": "mnist-360", "method": "er", "buffer": b, "lr": 0.1} for b in (200, 500, 1000)}
    for key, run in runs.items():
        (PROGRESS_DIR / key).mkdir(parents=True)
        (PROGRESS_DIR / key / "seed-0.ckpt").write_bytes(b"x")
        (PROGRESS_DIR / f"{key}.lock").write_text("1")
        write_json(run_dir(run) / "metrics.json", {"config": {"run": {**run, "lr": 0.2 if run["buffer"] == 500 else 0.1}}})
    with RunLock(PROGRESS_DIR / "m-er-1000.lock", "m-er-1000"):          # being trained
        assert sweep_finished_progress(runs) == ["m-er-200"]
    assert not (PROGRESS_DIR / "m-er-200").exists() and not (PROGRESS_DIR / "m-er-200.lock").exists()
    assert (PROGRESS_DIR / "m-er-500" / "seed-0.ckpt").exists()          # metrics.json of other settings
    assert (PROGRESS_DIR / "m-er-1000" / "seed-0.ckpt").exists()
    assert sweep_finished_progress(runs) == ["m-er-1000"]                 # once its trainer is gone
