"""The report: the paper's tables with our mean ± std beside its numbers, a per-seed summary,
headline metrics for `dvc exp show`, and figures.

It reads exactly the cells that params.yaml lists (never a glob of runs/), so removed cells
cannot leak into the tables.
"""
from __future__ import annotations

import io
import json
from pathlib import Path

import pandas as pd

from gcl.atomic import atomic_path, write_json, write_text
from gcl.layout import run_dir

# Row order of the paper's tables, our variants after their method; other methods follow, alphabetically.
PAPER_ORDER = ["joint", "sgd", "lwf", "oewc", "si", "cndpm", "gem", "icarl", "fdr", "hal",
               "er", "agem", "gss", "der", "derpp", "derpp-tuned", "coca", "coca-g001"]

# Where our row is compared with another row of the paper: the CoCa paper's "DER" row holds the
# DER paper's DER++ numbers, so it sits beside our derpp; our der sits beside the DER paper's own
# DER numbers (reference/der_paper_results.csv, table "der_paper").
PAPER_ROW = {"derpp": (None, "der"), "derpp-tuned": (None, "der"), "der": ("der_paper", "der")}
FOOTNOTES = {"derpp": "derpp's paper column is the CoCa paper's \"DER\" row, which holds the DER paper's DER++ numbers.",
             "derpp-tuned": "derpp-tuned is DER++ with settings chosen on a validation split (params.yaml records the "
                            "grid); its paper column is the same \"DER\" row.",
             "der": "der's paper column is plain DER as the DER paper reports it (the CoCa paper has no plain-DER row)."}

# Table 3: our variant names (all configurations of the one CoCa class) and the paper's rows.
ABLATION_ROWS = [("ER (all off)", "coca-off", "er"), ("CKD", "coca-ckd", "coca[ckd]"), ("PT", "coca-pt", "coca[pt]"),
                 ("SCL", "coca-scl", "coca[scl]"), ("PT+SCL", "coca-pt-scl", "coca[pt+scl]"),
                 ("CKD+PT", "coca-ckd-pt", "coca[ckd+pt]"), ("CKD+SCL", "coca-ckd-scl", "coca[ckd+scl]"),
                 ("CKD+PT+SCL (CoCa)", "coca", "coca")]


class ReportError(RuntimeError):
    pass


def load_cells(params: dict) -> list[dict]:
    cells = []
    for key, run in params["runs"].items():
        path = run_dir(run) / "metrics.json"
        if not path.exists():
            raise ReportError(f"{path} (cell {key}) is missing: run `dvc repro` so its train stage runs first")
        cells.append(json.loads(path.read_text()))
    return cells


def summary_frame(cells: list[dict]) -> pd.DataFrame:
    rows = []
    for c in cells:
        for seed, r in c["seeds"].items():
            rows.append({"benchmark": c["benchmark"], "method": c["method"], "buffer": str(c["buffer"]),
                         "seed": int(seed), "class_il": r["class_il"], "task_il": r["task_il"],
                         "forgetting": r["forgetting"], "train_seconds": r["train_seconds"],
                         "samples_per_second": r["samples_per_second"], "device": c["device"]})
    return pd.DataFrame(rows)


def _fmt(mean, std) -> str:
    if mean is None or pd.isna(mean):
        return "-"
    return f"{mean:.2f} ± {std:.2f}"


def _method_order(methods) -> list[str]:
    known = [m for m in PAPER_ORDER if m in methods]
    return known + sorted(set(methods) - set(known))


def _buffer_key(b: str):
    return (b != "none", int(b) if b.isdigit() else 0)


def default_rows(methods) -> list[tuple[str, str, tuple | None]]:
    """(label, our method, (paper table or None for the table at hand, paper method)) in the paper's order.
    Table 3's partial CoCa configurations are left to Table 3."""
    partial = {ours for _, ours, _ in ABLATION_ROWS if ours != "coca"}
    return [(m, m, PAPER_ROW.get(m, (None, m))) for m in _method_order(methods) if m not in partial]


def accuracy_table(summary: pd.DataFrame, paper: pd.DataFrame, benchmark: str, metric: str,
                   paper_table: str, rows: list | None = None) -> str:
    """One benchmark's table: a row per method, per buffer our mean ± std and the paper's number."""
    ours = summary[summary.benchmark == benchmark]
    stats = ours.groupby(["method", "buffer"])[metric].agg(["mean", "std"]).reset_index()
    stats["std"] = stats["std"].fillna(0.0)
    rows = rows if rows is not None else default_rows(stats.method.unique())
    buffers = sorted(stats[stats.method.isin([r[1] for r in rows])].buffer.unique(), key=_buffer_key)
    out = []
    for label, method, (ref_table, ref_method) in rows:
        ref = paper[(paper.table == (ref_table or paper_table)) & (paper.benchmark == benchmark) &
                    (paper.method == ref_method)]
        row = {"method": label}
        for b in buffers:
            hit = stats[(stats.method == method) & (stats.buffer == b)]
            p = ref[(ref.buffer == b) if b != "none" else ref.buffer.isna()]
            name = "no buffer" if b == "none" else f"B={b}"
            row[f"{name} ours"] = _fmt(*hit[["mean", "std"]].iloc[0]) if len(hit) else "-"
            row[f"{name} paper"] = f"{p.accuracy.iloc[0]:.2f}" if len(p) else "-"
        out.append(row)
    return pd.DataFrame(out).to_markdown(index=False)


def ablation_rows(summary: pd.DataFrame, benchmark: str) -> list | None:
    present = set(summary[summary.benchmark == benchmark].method)
    if not any(m.startswith("coca-") for m in present):
        return None
    rows = [(label, ours, (None, theirs)) for label, ours, theirs in ABLATION_ROWS if ours in present]
    if "coca-off" not in present and "er" in present:   # ER at its own settings stands in for "all off"
        rows.insert(0, ("ER", "er", (None, "er")))
    return rows


def cost_table(summary: pd.DataFrame) -> str:
    agg = summary.groupby(["benchmark", "method", "buffer"]).agg(
        seeds=("seed", "count"), forgetting=("forgetting", "mean"),
        train_seconds=("train_seconds", "mean"), samples_per_second=("samples_per_second", "mean"),
        device=("device", "first")).reset_index()
    return agg.to_markdown(index=False, floatfmt=".2f")


def render_tables(params: dict, summary: pd.DataFrame, paper: pd.DataFrame) -> str:
    out = io.StringIO()
    out.write("# Results: our numbers beside the paper's\n\n")
    out.write(f"Mean ± std over seeds {params['seeds']}; accuracies in %. Generated by `dvc repro` "
              "(stage `report`) from runs/*/*/*/metrics.json; do not edit by hand.\n\n")
    benchmarks = [b for b in params["benchmarks"] if b in set(summary.benchmark)]
    out.write("Data:\n\n")
    for b in benchmarks:
        cfg = params["benchmarks"][b]
        out.write(f"- **{b}**: {cfg.get('label') or cfg['source']} (source `{cfg['source']}`)\n")
    methods = set(summary.method)
    notes = [text for m, text in FOOTNOTES.items() if m in methods]
    out.write("\n## Table 1: Class-IL / general continual accuracy\n\n")
    out.write("".join(f"- {n}\n" for n in notes) + ("\n" if notes else ""))
    for b in benchmarks:
        out.write(f"### {b}\n\n{accuracy_table(summary, paper, b, 'class_il', 'table1_gcl')}\n\n")
    task_benchmarks = [b for b in benchmarks if summary[summary.benchmark == b].task_il.notna().any()]
    if task_benchmarks:
        out.write("## Table 2: Task-IL accuracy\n\n")
        for b in task_benchmarks:
            out.write(f"### {b}\n\n{accuracy_table(summary, paper, b, 'task_il', 'table2_task_il')}\n\n")
    ablations = {b: ablation_rows(summary, b) for b in benchmarks}
    if any(ablations.values()):
        out.write("## Table 3: ablation of CoCa's components (Class-IL)\n\n"
                  "Every row is a configuration of the one CoCa implementation (switches ckd, pt, scl); "
                  "all switches off is ER.\n\n")
        for b, rows in ablations.items():
            if rows:
                out.write(f"### {b}\n\n{accuracy_table(summary, paper, b, 'class_il', 'table3_ablation', rows)}\n\n")
    split_benchmarks = [b for b in ("seq-cifar100-10t", "seq-cifar100") if b in benchmarks]
    if "seq-cifar100-10t" in split_benchmarks:
        out.write("## Table 4: sequential CIFAR-100 in 10 and 20 tasks (Class-IL)\n\n")
        for b in split_benchmarks:
            out.write(f"### {b}\n\n{accuracy_table(summary, paper, b, 'class_il', 'table4_num_tasks')}\n\n")
    out.write("## Forgetting and cost per cell\n\n"
              "Forgetting: mean over evaluation groups (tasks; digits on MNIST-360) of the best earlier "
              "accuracy minus the final one. Train seconds exclude evaluation.\n\n")
    out.write(cost_table(summary) + "\n")
    return out.getvalue()


def headline(summary: pd.DataFrame) -> dict:
    """What `dvc exp show` displays: mean Class-IL per cell, and the total training time."""
    out: dict = {"class_il": {}}
    means = summary.groupby(["benchmark", "method", "buffer"], sort=False).class_il.mean()
    for (bench, method, buffer), value in means.items():
        out["class_il"].setdefault(bench, {}).setdefault(method, {})[buffer] = round(float(value), 2)
    out["train_seconds_total"] = round(float(summary.train_seconds.sum()), 1)
    return out


def plot_curves(cells: list[dict], out_dir: Path) -> list[Path]:
    """Accuracy after every segment/task end, mean over seeds, one figure per benchmark."""
    plt = _pyplot()
    paths = []
    for bench in sorted({c["benchmark"] for c in cells}):
        fig, ax = plt.subplots(figsize=(7, 4))
        for c in cells:
            if c["benchmark"] != bench:
                continue
            curves = [r["curve"] for r in c["seeds"].values()]
            if len(curves[0]) < 2:   # offline methods (JOINT) have only a final point
                continue
            mean = [sum(v) / len(v) for v in zip(*curves)]
            ax.plot(range(1, len(mean) + 1), mean, label=f"{c['method']} ({c['buffer']})")
        ax.set_xlabel("evaluation after segment / task")
        ax.set_ylabel("accuracy (%)")
        ax.set_title(f"{bench}: accuracy over the stream")
        ax.legend(fontsize=7, ncol=2)
        ax.grid(alpha=0.3)
        paths.append(_save(fig, out_dir / f"{bench}-curves.png"))
    return paths


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(fig, path: Path) -> Path:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
    _pyplot().close(fig)
    return path


def visualised_cells(params: dict, cells: list[dict]) -> tuple[str, list[dict]]:
    """The cells that report.visualise names as 'method/buffer' on its benchmark, in that order."""
    spec = params.get("report", {}).get("visualise")
    if not spec:
        return "", []
    by_name = {(c["benchmark"], f"{c['method']}/{c['buffer']}"): c for c in cells}
    chosen = []
    for name in spec["cells"]:
        if (spec["benchmark"], name) not in by_name:
            raise ReportError(f"report.visualise.cells: {spec['benchmark']} {name!r} is not a cell of runs: "
                              f"use 'method/buffer' of a run on that benchmark, e.g. "
                              f"{sorted(n for b, n in by_name if b == spec['benchmark'])}")
        chosen.append(by_name[(spec["benchmark"], name)])
    return spec["benchmark"], chosen


def plot_confusions(bench: str, cells: list[dict], path: Path) -> Path:
    """Row-normalised confusion matrices of the first seed after the stream (the paper's Figure 6)."""
    import numpy as np
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(cells), figsize=(3.2 * len(cells), 3.4), squeeze=False)
    for ax, c in zip(axes[0], cells):
        counts = np.array(next(iter(c["seeds"].values()))["confusion"], dtype=float)
        seen = counts.sum(1) > 0                      # MNIST-360's network has no test images of some outputs
        counts = counts[seen][:, seen]
        ax.imshow(counts / counts.sum(1, keepdims=True), vmin=0, vmax=1, cmap="Blues")
        ax.set_title(f"{c['method']} ({c['buffer']})", fontsize=9)
        ax.set_xlabel("predicted")
        ax.set_ylabel("true")
    fig.suptitle(f"{bench}: confusion matrices (first seed)")
    return _save(fig, path)


def plot_tsne(bench: str, cells: list[dict], path: Path) -> Path:
    """t-SNE of the final penultimate features of the evaluation images (the paper's Figure 5)."""
    import torch
    from sklearn.manifold import TSNE
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(cells), figsize=(3.2 * len(cells), 3.4), squeeze=False)
    for ax, c in zip(axes[0], cells):
        saved = torch.load(run_dir(c) / "features.pt", weights_only=True)
        xy = TSNE(n_components=2, init="pca", perplexity=30, random_state=0).fit_transform(saved["features"].float().numpy())
        points = ax.scatter(xy[:, 0], xy[:, 1], c=saved["labels"].numpy(), cmap="tab10", s=3)
        ax.set_title(f"{c['method']} ({c['buffer']})", fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.legend(*points.legend_elements(), title="class", loc="center right", fontsize=7, title_fontsize=8)
    fig.suptitle(f"{bench}: t-SNE of test features (seed {saved['seed']})")
    return _save(fig, path)


def plot_sensitivity(params: dict, cells: list[dict], path: Path) -> Path | None:
    """Class-IL against omega and against gamma (the paper's Figure 4), mean ± std over seeds.

    report.sensitivity names, per swept parameter, the methods (CoCa variants) whose cells on the
    given benchmark and buffer form the sweep; the x value is read from each cell's resolved config.
    """
    spec = params.get("report", {}).get("sensitivity")
    if not spec:
        return None
    plt = _pyplot()
    swept = [k for k in ("omega", "gamma") if spec.get(k)]
    fig, axes = plt.subplots(1, len(swept), figsize=(4.5 * len(swept), 3.4), squeeze=False)
    for ax, param in zip(axes[0], swept):
        points = []
        for method in spec[param]:
            cell = next((c for c in cells if c["benchmark"] == spec["benchmark"] and c["method"] == method
                         and str(c["buffer"]) == str(spec["buffer"])), None)
            if cell is None:
                raise ReportError(f"report.sensitivity.{param}: no cell {spec['benchmark']}/{method}/{spec['buffer']} "
                                  "in runs; add its run or drop it from the sweep")
            accs = pd.Series([r["class_il"] for r in cell["seeds"].values()])
            points.append((cell["config"]["run"][param], accs.mean(), accs.std() if len(accs) > 1 else 0.0))
        points.sort()
        x, m, sd = zip(*points)
        ax.errorbar(x, m, yerr=sd, marker="o", capsize=3)
        ax.set_xlabel(param)
        ax.set_ylabel("Class-IL accuracy (%)")
        ax.grid(alpha=0.3)
    fig.suptitle(f"{spec['benchmark']}, buffer {spec['buffer']}: sensitivity of CoCa")
    return _save(fig, path)


def write_report(params: dict, out_dir: str | Path, paper_csvs: list[str | Path]) -> None:
    out_dir = Path(out_dir)
    cells = load_cells(params)
    summary = summary_frame(cells)
    paper = pd.concat([pd.read_csv(f, dtype={"buffer": "string"}) for f in paper_csvs])
    with atomic_path(out_dir / "summary.csv") as tmp:
        summary.to_csv(tmp, index=False)
    write_text(out_dir / "tables.md", render_tables(params, summary, paper))
    write_json(out_dir / "metrics.json", headline(summary))
    figures = out_dir / "figures"
    figures.mkdir(parents=True, exist_ok=True)
    if params.get("report", {}).get("figures", True):
        plot_curves(cells, figures)
        bench, chosen = visualised_cells(params, cells)
        if chosen:
            plot_confusions(bench, chosen, figures / f"{bench}-confusion.png")
            plot_tsne(bench, chosen, figures / f"{bench}-tsne.png")
        plot_sensitivity(params, cells, figures / "sensitivity.png")
