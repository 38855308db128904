"""Accuracy per evaluation group (a task, or a digit on MNIST-360), Class-IL and Task-IL, and forgetting."""
from __future__ import annotations

from collections.abc import Callable

import torch


def mask_to_classes(logits: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """A copy of `logits` with every class outside [lo, hi) (per row) set to -inf; the input is untouched."""
    classes = torch.arange(logits.shape[1], device=logits.device)
    inside = (classes[None, :] >= lo[:, None]) & (classes[None, :] < hi[:, None])
    return logits.masked_fill(~inside, float("-inf"))


def evaluation_batch(backbone: str, device: torch.device) -> int:
    """Images per evaluation batch: 256 for a ResNet-18 on a CPU (faster than larger batches, whose activations
    leave the caches: docs/performance.md), else 1024. Only the rounding of the logits depends on it."""
    return 256 if backbone == "resnet18" and device.type == "cpu" else 1024


class Evaluator:
    """Holds the evaluation set on the device and scores a predictor on every group in one pass. Each pass also
    counts its confusion matrix (`last_confusion`), so that the final one needs no pass of its own."""

    def __init__(self, bench: dict, transform: Callable, device: torch.device, batch: int = 1024):
        self.x = bench["test_x"].to(device)
        self.y = bench["test_y"].to(device)
        self.group = bench["test_group"].to(device)
        self.n_groups = len(bench["group_names"])
        self.counts = torch.bincount(self.group, minlength=self.n_groups).double()
        self.transform = transform
        self.batch = batch
        self.n_classes = bench["n_classes"]
        self.last_confusion: list[list[int]] | None = None
        # Task-IL needs each group's class range; only benchmarks with tasks have one
        self.task_classes = None
        if bench["n_tasks"]:
            c = bench["classes_per_task"]
            self.task_classes = (self.group * c, self.group * c + c)

    def _batches(self, fn: Callable[[torch.Tensor], torch.Tensor]):
        for lo in range(0, len(self.x), self.batch):
            yield slice(lo, lo + self.batch), fn(self.transform(self.x[lo:lo + self.batch]))

    def _confusion_counts(self, y: torch.Tensor, predicted: torch.Tensor) -> torch.Tensor:
        n = self.n_classes
        return torch.bincount(y * n + predicted, minlength=n * n)

    @torch.no_grad()
    def confusion(self, predict: Callable[[torch.Tensor], torch.Tensor]) -> list[list[int]]:
        """counts[true][predicted] over the whole evaluation set (Class-IL predictions)."""
        counts = torch.zeros(self.n_classes ** 2, dtype=torch.int64, device=self.x.device)
        for sl, logits in self._batches(predict):
            counts += self._confusion_counts(self.y[sl], logits.argmax(1))
        return counts.view(self.n_classes, self.n_classes).tolist()

    @torch.no_grad()
    def features(self, embed: Callable[[torch.Tensor], torch.Tensor], max_samples: int) -> dict:
        """Penultimate features of up to `max_samples` evaluation images, evenly spread over the set."""
        keep = torch.linspace(0, len(self.x) - 1, min(max_samples, len(self.x))).round().long().to(self.x.device)
        feats = torch.cat([f for _, f in self._batches(embed)])[keep]
        return {"features": feats.half().cpu(), "labels": self.y[keep].cpu()}

    @torch.no_grad()
    def features_collapsed(self, embed: Callable[[torch.Tensor], torch.Tensor], samples: int = 256) -> bool:
        """True when the penultimate features of (up to `samples`) evaluation images are all identical."""
        feats = embed(self.transform(self.x[:samples])).float()
        return bool((feats - feats[:1]).abs().max() == 0)

    @torch.no_grad()
    def __call__(self, predict: Callable[[torch.Tensor], torch.Tensor]) -> dict:
        correct_cil = torch.zeros(self.n_groups, dtype=torch.float64, device=self.x.device)
        correct_til = torch.zeros_like(correct_cil)
        confusion = torch.zeros(self.n_classes ** 2, dtype=torch.int64, device=self.x.device)
        for sl, logits in self._batches(predict):
            group, predicted = self.group[sl], logits.argmax(1)
            correct_cil += torch.bincount(group, weights=(predicted == self.y[sl]).double(), minlength=self.n_groups)
            confusion += self._confusion_counts(self.y[sl], predicted)
            if self.task_classes is not None:
                masked = mask_to_classes(logits, self.task_classes[0][sl], self.task_classes[1][sl])
                correct_til += torch.bincount(group, weights=(masked.argmax(1) == self.y[sl]).double(),
                                              minlength=self.n_groups)
        self.last_confusion = confusion.view(self.n_classes, self.n_classes).tolist()
        counts = self.counts.to(correct_cil.device)
        result = {
            "class_il": (100.0 * correct_cil / counts).tolist(),
            "overall": float(100.0 * correct_cil.sum() / counts.sum()),
        }
        if self.task_classes is not None:
            result["task_il"] = (100.0 * correct_til / counts).tolist()
        return result


def forgetting(matrix: list[list[float]], first_row: list[int]) -> float | None:
    """Mean over groups of (best earlier accuracy - final accuracy).

    `matrix[l][g]` is group g's accuracy at evaluation l; `first_row[g]` is the first evaluation at
    which group g had been trained on. Groups with no earlier evaluation are left out.
    """
    last = len(matrix) - 1
    drops = [max(matrix[t][g] for t in range(first_row[g], last)) - matrix[last][g]
             for g in range(len(first_row)) if first_row[g] < last]
    return sum(drops) / len(drops) if drops else None


def summarise(rows: list[dict], loss_curve: list[float], has_tasks: bool, steps: int, samples: int,
              seconds: float, eval_seconds: float | None = None) -> dict:
    """A seed's metrics from its evaluation rows. Class-IL (and Task-IL) is the mean over tasks of the last
    row on benchmarks with tasks, the accuracy over the whole evaluation set on MNIST-360. Forgetting counts a
    task from the row after which it was first trained (a single row, e.g. JOINT's: nothing to forget); a
    digit of MNIST-360 from the first row."""
    matrix = [r["class_il"] for r in rows]
    final = rows[-1]
    n_groups = len(matrix[-1])
    if has_tasks:
        class_il = sum(final["class_il"]) / n_groups
        task_il = sum(final["task_il"]) / n_groups
        first_row = list(range(n_groups)) if len(rows) == n_groups else [len(rows) - 1] * n_groups
    else:  # one evaluation set (MNIST-360): accuracy over all of it
        class_il, task_il = final["overall"], None
        first_row = [0] * n_groups
    return {
        "class_il": class_il,
        "task_il": task_il,
        "acc_matrix": matrix,
        "task_il_matrix": [r["task_il"] for r in rows] if has_tasks else None,
        "curve": [r["overall"] for r in rows],
        "loss_curve": loss_curve,
        "forgetting": forgetting(matrix, first_row),
        "steps": steps,
        "samples": samples,
        "train_seconds": seconds,
        "eval_seconds": eval_seconds,
        "samples_per_second": samples / seconds if seconds > 0 else None,
    }
