"""Progress lines of a run: printed, prefixed with the run and seed, and appended to the run's log file.

Each line goes out as one write, to stdout and to the log (opened for appending), so the lines of seeds
training side by side in several processes stay whole; they interleave only line by line.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

from gcl.core.errors import writing

PROGRESS_SECONDS = 60.0   # a progress line at least this often, besides one at every evaluation


def clock(seconds: float) -> str:
    """h:mm:ss"""
    seconds = max(round(seconds), 0)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


@dataclass
class Progress:
    """Where the lines of one run go; `seed` set (`for_seed`) prefixes them with it. Picklable (spawned workers)."""

    run: str
    log: Path | None = None
    seed: int | None = None
    every: float = PROGRESS_SECONDS

    def for_seed(self, seed: int) -> Progress:
        return Progress(self.run, self.log, seed, self.every)

    def say(self, text: str) -> None:
        prefix = self.run if self.seed is None else f"{self.run} seed {self.seed}"
        line = f"[{prefix}] {text}\n"
        sys.stdout.write(line)
        sys.stdout.flush()
        if self.log is not None:
            self.log.parent.mkdir(parents=True, exist_ok=True)
            with writing(self.log), open(self.log, "a", encoding="utf-8") as f:   # a full disk names the log
                f.write(line)


class StreamProgress:
    """Where a seed is in its stream, and when the next line is due.

    `position(step)` names the task (or segment) and epoch of a step; speed and the estimate of the time left
    count only the steps of this attempt (a resumed seed does not claim the steps it reloaded).
    """

    def __init__(self, progress: Progress, stream, has_tasks: bool, epochs: int, start_step: int):
        self.progress, self.stream, self.has_tasks, self.epochs = progress, stream, has_tasks, epochs
        self.start_step = start_step
        self.started = self.last = time.monotonic()
        self.marks = stream.task_ends if has_tasks else stream.eval_after

    def due(self) -> bool:
        return time.monotonic() - self.last >= self.progress.every

    def position(self, step: int) -> str:
        """'task 2/5, epoch 3/50' on benchmarks with tasks, 'segment 4/20' on a single stream."""
        part = next((i for i, end in enumerate(self.marks) if step <= end), len(self.marks) - 1)
        if not self.has_tasks:
            return f"segment {part + 1}/{len(self.marks)}" if self.marks else "offline pass"
        first = self.marks[part - 1] + 1 if part else 0
        per_epoch = (self.marks[part] - first + 1) / self.epochs
        epoch = min(int((step - first) // per_epoch), self.epochs - 1) + 1
        return f"task {part + 1}/{len(self.marks)}, epoch {epoch}/{self.epochs}"

    def report(self, step: int, accuracy: float | None) -> None:
        """A line after `step` (0-based) has run: position, step of steps, speed, elapsed and remaining time."""
        now = time.monotonic()
        self.last = now
        done, steps = step + 1, self.stream.steps
        elapsed = now - self.started
        ran = done - self.start_step
        samples = self.stream.bounds[done] - self.stream.bounds[self.start_step]
        rate = samples / elapsed if elapsed > 0 else 0.0
        left = elapsed / ran * (steps - done) if ran > 0 else 0.0
        acc = "-" if accuracy is None else f"{accuracy:.2f}"
        self.progress.say(f"{self.position(step)}, step {done}/{steps}, {rate:.0f} samples/s, "
                          f"elapsed {clock(elapsed)}, left {clock(left)}, last accuracy {acc}")
