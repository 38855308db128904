"""Evaluation: per-group accuracy, Task-IL masking that leaves the caller's logits alone, forgetting."""
import pytest
import torch

from gcl.training.evaluate import Evaluator, forgetting, mask_to_classes


def test_mask_keeps_only_the_task_classes_and_copies():
    logits = torch.tensor([[5.0, 1.0, 2.0, 3.0], [0.0, 9.0, 1.0, 2.0]])
    before = logits.clone()
    masked = mask_to_classes(logits, torch.tensor([2, 0]), torch.tensor([4, 2]))
    assert torch.equal(logits, before)
    assert masked.argmax(1).tolist() == [3, 1]
    assert torch.isinf(masked[0, :2]).all() and torch.isinf(masked[1, 2:]).all()


def _task_bench():
    # 2 tasks x 2 classes; 2 test samples per class
    y = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    return {"test_x": y.view(-1, 1).to(torch.uint8), "test_y": y, "test_group": y // 2,
            "group_names": ["t0", "t1"], "n_tasks": 2, "classes_per_task": 2, "n_classes": 4}


def test_class_il_and_task_il_per_task():
    bench = _task_bench()
    # a predictor that prefers class 3, then the true class: Class-IL right only on class 3,
    # Task-IL right on all of task 0 (class 3 masked out) and on class 3 of task 1
    def predict(x):
        y = x.view(-1).long()
        logits = torch.zeros(len(y), 4)
        logits[torch.arange(len(y)), y] = 1.0
        logits[:, 3] = 2.0
        return logits
    out = Evaluator(bench, lambda x: x, torch.device("cpu"))(predict)
    assert out["class_il"] == [0.0, 50.0]
    assert out["task_il"] == [100.0, 50.0]   # within task 1, class 3 still wins
    assert out["overall"] == 25.0


def test_no_task_il_without_tasks():
    bench = _task_bench()
    bench["n_tasks"] = 0
    out = Evaluator(bench, lambda x: x, torch.device("cpu"))(lambda x: torch.zeros(len(x), 4))
    assert "task_il" not in out and out["class_il"] == [50.0, 0.0]


def test_forgetting_by_hand():
    matrix = [[90.0, 0.0, 0.0],
              [60.0, 80.0, 0.0],
              [50.0, 70.0, 95.0]]
    # task 0: best earlier 90 -> 50 = 40; task 1: 80 -> 70 = 10; the last task is left out
    assert forgetting(matrix, [0, 1, 2]) == pytest.approx(25.0)
    assert forgetting([[70.0]], [0]) is None


def test_confusion_counts_true_against_predicted():
    bench = _task_bench()
    ev = Evaluator(bench, lambda x: x, torch.device("cpu"))
    # predicts class (y + 1) % 4 for every sample
    conf = ev.confusion(lambda x: torch.nn.functional.one_hot((x.view(-1).long() + 1) % 4, 4).float())
    assert conf == [[0, 2, 0, 0], [0, 0, 2, 0], [0, 0, 0, 2], [2, 0, 0, 0]]


def test_features_are_evenly_spread_and_labelled():
    bench = _task_bench()
    ev = Evaluator(bench, lambda x: x, torch.device("cpu"))
    out = ev.features(lambda x: x.float().repeat(1, 3), max_samples=4)
    assert out["labels"].tolist() == [0, 1, 2, 3]
    assert out["features"].shape == (4, 3) and out["features"].dtype == torch.float16
