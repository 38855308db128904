"""What a run produces, typed: one seed's metrics (SeedResult) and a run's metrics.json (RunResult).

The training loop builds them, the report reads them back; metrics.json is their JSON form (`to_json`,
`from_json`), one field per key, in this order. Accuracies are percentages.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

# the fields that measure time, not what was learnt: the only ones a resumed or regrouped seed may change
TIMINGS = ("train_seconds", "samples_per_second", "eval_seconds")


@dataclass
class SeedResult:
    """One seed of one run: metrics.json's `seeds.<seed>`."""

    class_il: float                              # Class-IL: mean over tasks of the last row (MNIST-360: whole set)
    task_il: float | None                        # Task-IL; None on a benchmark without tasks
    acc_matrix: list[list[float]]                # [evaluation][group] Class-IL accuracy (group: task, or digit)
    task_il_matrix: list[list[float]] | None     # [evaluation][task] Task-IL accuracy
    curve: list[float]                           # accuracy over the whole evaluation set, per evaluation
    loss_curve: list[float]                      # mean training loss between evaluations
    forgetting: float | None                     # mean drop from a group's best earlier accuracy to its last
    steps: int                                   # SGD steps the stream took
    samples: int                                 # stream samples seen
    train_seconds: float                         # wall time of the training steps (not of evaluations)
    samples_per_second: float | None
    # wall time of the evaluations (the rows, the final confusion matrix and features); None where not measured
    eval_seconds: float | None = None
    confusion: list[list[int]] = field(default_factory=list)     # [true][predicted] counts, Class-IL
    method_metrics: dict = field(default_factory=dict)           # a method's own numbers (e.g. CN-DPM's experts)
    environment: dict = field(default_factory=dict)              # torch version, device, threads, precision
    # the final network's features of some evaluation images, for t-SNE (first seed only); saved apart from the
    # JSON, as the run's features.pt
    features: dict | None = field(default=None, repr=False)

    def to_json(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        del out["features"]
        return out

    @classmethod
    def from_json(cls, data: dict) -> SeedResult:
        """A stored seed; what older results lack (steps, samples, environment, ...) reads as None (or empty)."""
        known = {f.name for f in dataclasses.fields(cls)} - {"features"}
        values = {k: v for k, v in data.items() if k in known}
        for name in known - {"class_il", "confusion", "method_metrics", "environment"}:
            values.setdefault(name, None)
        return cls(**values)


@dataclass
class RunResult:
    """One run (a table cell), every seed: runs/<benchmark>/<method>/<buffer>/metrics.json."""

    benchmark: str
    method: str
    buffer: int | str                            # "none" for a method without a buffer
    device: str                                  # cpu | cuda
    torch: str
    threads: int
    workers: int
    config: dict                                 # the resolved settings it ran with: {"run": ..., "benchmark": ...}
    seeds: dict[int, SeedResult]                 # in params.yaml's order
    mean: dict[str, float | None]                # class_il, task_il, forgetting over seeds
    std: dict[str, float | None]

    def to_json(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["seeds"] = {str(seed): r.to_json() for seed, r in self.seeds.items()}
        return out

    @classmethod
    def from_json(cls, data: dict) -> RunResult:
        values = {f.name: data.get(f.name) for f in dataclasses.fields(cls)}
        values["seeds"] = {int(seed): SeedResult.from_json(r) for seed, r in data["seeds"].items()}
        return cls(**values)

    @property
    def run(self) -> dict:
        """The run's flat settings (benchmark, method, buffer, algorithm, the method's settings)."""
        return self.config["run"]
