"""The report: the paper's tables with our mean ± std beside its numbers, a headline (the main method
against the best baseline), a per-seed summary, the few numbers `dvc exp show` compares, plot data for
`dvc plots`, and figures (gcl.report.figures).

It knows nothing of one profile: row names, row order, the paper rows each method is compared with,
footnotes and the tables themselves come from the `report:` block of params.yaml (declared in
gcl.report.settings) or from the method's registration (its algorithm; optional `label` and
`paper_row` class attributes).

It reads exactly the runs that params.yaml lists (never a glob of runs/), so removed runs cannot leak
into the tables; a run folder on disk that params.yaml no longer lists is named in a warning. Every
output is built in a temporary folder first and moved into place only when all of them succeeded.
Longer than ~300 lines because every table shares the display settings (Display) and the formatting here;
the figures are apart (gcl.report.figures).
"""
from __future__ import annotations

import io
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from gcl.core.atomic import remove_stale_temporaries
from gcl.core.errors import writing
from gcl.core.layout import run_dir
from gcl.core.results import RunResult
from gcl.report.figures import draw_all, write_plot_data
from gcl.report.common import ReportError, buffer_key, warn
from gcl.report.reproductions import read_verified
from gcl.report.settings import ReportSettings

OUTPUTS = ("tables.md", "summary.csv", "metrics.json", "figures", "plots")
SETTING = {"class_il": "class-il", "task_il": "task-il"}   # our metric -> the reference files' `setting`




# ---------------------------------------------------------------------------- inputs

def load_cells(resolved: dict) -> list[RunResult]:
    """Each run's metrics.json, in the order params.yaml lists the runs."""
    cells = []
    for key, run in resolved["runs"].items():
        path = run_dir(run) / "metrics.json"
        if not path.exists():
            raise ReportError(f"{path} (run {key}) is missing: run `dvc repro` so its train stage runs first")
        cells.append(RunResult.from_json(json.loads(path.read_text())))
    return cells


def stale_runs(resolved: dict, root: str | Path = "runs") -> list[str]:
    """Run folders on disk (runs/<benchmark>/<method>/<buffer>/metrics.json) that params.yaml does not list."""
    listed = {run_dir(r) for r in resolved["runs"].values()}
    found = sorted(p.parent for p in Path(root).glob("*/*/*/metrics.json"))
    return [p.as_posix() for p in found if p not in listed]


ENVIRONMENT = ("torch", "device", "threads", "precision", "compiled")   # a seed's environment: summary.csv's env_*


def environments(rows: pd.DataFrame) -> list[str]:
    """The distinct environments of these summary rows, in words, most seeds first."""
    envs = rows.reindex(columns=[f"env_{k}" for k in ENVIRONMENT])
    envs["env_compiled"] = envs["env_compiled"].astype(object).fillna("eager")   # results from before compiled backbones
    counts = envs.fillna("?").astype(str).value_counts()
    return [f"torch {t}, {d}, {n} thread(s), {p}{'' if m == 'eager' else ', compiled (' + m + ')'} ({c} seeds)"
            for (t, d, n, p, m), c in counts.items()]


def summary_frame(cells: list[RunResult]) -> pd.DataFrame:
    """One row per (benchmark, method, buffer, seed); a method's numeric extra metrics as
    `method_metrics.<name>` columns (e.g. CN-DPM's experts)."""
    rows = []
    for c in cells:
        for seed, r in c.seeds.items():
            row = {"benchmark": c.benchmark, "method": c.method, "buffer": str(c.buffer),
                   "seed": seed, "class_il": r.class_il, "task_il": r.task_il,
                   "forgetting": r.forgetting, "steps": r.steps, "samples": r.samples,
                   "train_seconds": r.train_seconds, "samples_per_second": r.samples_per_second,
                   "device": c.device}
            env = r.environment or {"torch": c.torch, "threads": c.threads}   # older results
            row.update({f"env_{k}": env.get(k) for k in ENVIRONMENT})
            for k, v in r.method_metrics.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    row[f"method_metrics.{k}"] = v
            rows.append(row)
    frame = pd.DataFrame(rows)
    for col in ("class_il", "task_il", "forgetting", "steps", "samples", "train_seconds", "samples_per_second"):
        frame[col] = pd.to_numeric(frame[col])
    return frame


def read_paper(paper_csvs) -> pd.DataFrame:
    return pd.concat([pd.read_csv(f, dtype={"buffer": "string"}) for f in paper_csvs], ignore_index=True)


@dataclass
class Reproduction:
    """Another profile's committed results: `folder`/params.yaml resolved, and `folder`/results/summary.csv."""
    folder: str
    title: str
    resolved: dict
    settings: ReportSettings
    summary: pd.DataFrame
    head: list[dict]


def read_reproduction(folder: str | Path, paper: pd.DataFrame) -> Reproduction:
    """One folder of `report.reproductions`, as check@reproductions verified it against its own dvc.lock
    (gcl.report.reproductions: every seed of every run its params.yaml lists, once, nothing edited)."""
    resolved, summary = read_verified(folder)
    settings = ReportSettings.model_validate(resolved.get("report") or {})
    labels = [cfg.get("label") or name for name, cfg in resolved["benchmarks"].items()]
    head = headline(summary, paper, Display(resolved, settings))
    return Reproduction(Path(folder).as_posix(), "; ".join(labels), resolved, settings, summary, head)


# ---------------------------------------------------------------------------- display settings

class Display:
    """Labels, paper rows, notes and row order, from report settings over the registered defaults."""

    def __init__(self, resolved: dict, settings: ReportSettings):
        self.settings = settings
        self.registered = resolved.get("methods") or {}
        self.algorithm = {r["method"]: r.get("algorithm", r["method"]) for r in resolved["runs"].values()}
        named = list(self.registered) + [r["method"] for r in resolved["runs"].values()]
        self.order = list(dict.fromkeys(list(settings.order) + named))

    def _spec(self, method: str):
        return self.settings.methods.get(method)

    def label(self, method: str) -> str:
        spec = self._spec(method)
        return (spec and spec.label) or self.registered.get(method, {}).get("label") or method

    def algorithm_of(self, method: str) -> str:
        return self.registered.get(method, {}).get("algorithm") or self.algorithm.get(method, method)

    def paper_row(self, method: str) -> tuple[str | None, str]:
        """(reference table or None for the table at hand, row name in the reference files)."""
        spec = self._spec(method)
        row = (spec and spec.paper_row) or self.registered.get(method, {}).get("paper_row") or self.algorithm_of(method)
        return (spec.paper_table if spec else None), row

    def notes(self, method: str, benchmark: str) -> list[str]:
        spec = self._spec(method)
        return [n.text for n in (spec.notes if spec else []) if n.benchmarks is None or benchmark in n.benchmarks]

    def sort(self, methods) -> list[str]:
        methods = set(methods)
        known = [m for m in self.order if m in methods]
        return known + sorted(methods - set(known))


def paper_value(paper: pd.DataFrame, table: str, metric: str, benchmark: str, row: str, buffer: str) -> float | None:
    """The paper's number, or None. The reference file's `setting` must match the metric, so a Class-IL-only
    reference (the DER paper's) never fills a Task-IL column."""
    hit = paper[(paper.table == table) & (paper.setting == SETTING[metric]) & (paper.benchmark == benchmark)
                & (paper.method == row)]
    hit = hit[hit.buffer.isna()] if buffer == "none" else hit[hit.buffer == buffer]
    return float(hit.accuracy.iloc[0]) if len(hit) else None


def fmt_number(x) -> str:
    return "-" if x is None or pd.isna(x) else f"{x:.2f}"


def fmt_mean_std(mean, std) -> str:
    if mean is None or pd.isna(mean):
        return "-"
    return f"{mean:.2f} ± {0.0 if pd.isna(std) else std:.2f}"


def markdown(frame: pd.DataFrame) -> str:
    """A markdown table whose cells print exactly as formatted (tabulate would turn '66.90' back into 66.9)."""
    return frame.to_markdown(index=False, disable_numparse=True)


def stats(summary: pd.DataFrame, metric: str) -> pd.DataFrame:
    """mean and std (0 for one seed) of `metric` per (benchmark, method, buffer)."""
    s = summary.groupby(["benchmark", "method", "buffer"])[metric].agg(["mean", "std", "count"]).reset_index()
    s["std"] = s["std"].fillna(0.0)
    return s


# ---------------------------------------------------------------------------- tables

def table_benchmarks(spec, summary: pd.DataFrame, resolved: dict) -> list[str]:
    ran = [b for b in resolved["benchmarks"] if b in set(summary.benchmark)]
    if spec.benchmarks is not None:
        return list(spec.benchmarks) if all(b in ran for b in spec.benchmarks) else []
    return [b for b in ran if summary[summary.benchmark == b][spec.metric].notna().any()]


def table_rows(spec, display: Display, present: set[str]) -> list[tuple[str, str]]:
    """(row method, method shown) pairs of a table on one benchmark."""
    if spec.rows is None:
        return [(m, m) for m in display.sort(present) if m not in spec.exclude]
    rows = []
    for m in spec.rows:
        if m in present:
            rows.append((m, m))
        elif spec.stand_in.get(m) in present:
            rows.append((m, spec.stand_in[m]))
    return rows


def accuracy_table(spec, summary: pd.DataFrame, paper: pd.DataFrame, display: Display, benchmark: str) -> tuple[str, list[str]]:
    """One benchmark's table (markdown) and its footnotes."""
    ours = summary[summary.benchmark == benchmark]
    st = stats(ours, spec.metric)
    present = set(st.dropna(subset=["mean"]).method)
    rows = table_rows(spec, display, present)
    buffers = sorted(set(st[st.method.isin([shown for _, shown in rows])].buffer), key=buffer_key)
    out, notes = [], []
    for row_method, shown in rows:
        label = spec.labels.get(shown) or display.label(shown)   # a stand-in is named as itself
        ref_table, ref_row = display.paper_row(row_method)
        line, has_paper = {"method": label}, False
        for b in buffers:
            hit = st[(st.method == shown) & (st.buffer == b)]
            name = "no buffer" if b == "none" else f"B={b}"
            value = paper_value(paper, ref_table or spec.paper_table, spec.metric, benchmark, ref_row, b)
            line[f"{name} ours"] = "-"
            if len(hit):
                mean, std = hit[["mean", "std"]].iloc[0]
                close = value is not None and std > 0 and abs(mean - value) <= std
                line[f"{name} ours"] = fmt_mean_std(mean, std) + (f" {WITHIN_STD}" if close else "")
            line[f"{name} paper"] = fmt_number(value)
            has_paper |= value is not None
        out.append(line)
        if has_paper:     # a note explains a paper column: none where that column is empty
            notes += [f"{label}: {n}" for n in display.notes(shown, benchmark)]
    return markdown(pd.DataFrame(out)), list(dict.fromkeys(notes))


def cost_table(summary: pd.DataFrame, display: Display) -> str:
    agg = summary.groupby(["benchmark", "method", "buffer"]).agg(
        seeds=("seed", "count"), forgetting=("forgetting", "mean"), steps=("steps", "mean"),
        train_seconds=("train_seconds", "mean"), samples_per_second=("samples_per_second", "mean"),
        device=("device", "first")).reset_index()
    order = {m: i for i, m in enumerate(display.sort(agg.method))}
    agg = agg.sort_values(["benchmark", "method", "buffer"],
                          key=lambda col: col.map(order) if col.name == "method" else
                          col.map(buffer_key) if col.name == "buffer" else col)
    for col in ("forgetting", "train_seconds", "samples_per_second"):
        agg[col] = agg[col].map(fmt_number)
    agg["steps"] = agg["steps"].map(lambda v: "-" if pd.isna(v) else f"{v:,.0f}")
    agg["method"] = agg["method"].map(display.label)
    return markdown(agg)


def method_metrics_table(summary: pd.DataFrame, display: Display) -> str | None:
    """Mean over seeds of each method's own numeric metrics (e.g. CN-DPM's experts created)."""
    cols = [c for c in summary.columns if c.startswith("method_metrics.")]
    if not cols:
        return None
    frame = summary.dropna(subset=cols, how="all")
    agg = frame.groupby(["benchmark", "method", "buffer"])[cols].mean().reset_index()
    agg = agg.sort_values(["benchmark", "buffer"], key=lambda c: c.map(buffer_key) if c.name == "buffer" else c)
    for c in cols:
        agg[c] = agg[c].map(fmt_number)
    agg["method"] = agg["method"].map(display.label)
    return markdown(agg.rename(columns={c: c.split(".", 1)[1] for c in cols}))


# ---------------------------------------------------------------------------- headline

def headline(summary: pd.DataFrame, paper: pd.DataFrame, display: Display) -> list[dict]:
    """Per benchmark and buffer of the main method: its Class-IL (and Task-IL) and those of the best baseline
    (the method with the highest mean Class-IL at that buffer or without a buffer, variants of the main
    method and headline.exclude left out), with the paper's numbers. A method runs at one buffer or none,
    so (benchmark, method) picks one row among those."""
    h = display.settings.headline
    main_alg = display.algorithm_of(h.method)
    out = []
    cls, task = stats(summary, "class_il"), stats(summary, "task_il")
    for bench in dict.fromkeys(summary.benchmark):
        for b in sorted(set(cls[(cls.benchmark == bench) & (cls.method == h.method)].buffer), key=buffer_key):
            at = cls[(cls.benchmark == bench) & (cls.buffer.isin([b, "none"]))]   # methods without memory compete too
            base = at[~at.method.isin(h.exclude) & (at.method.map(display.algorithm_of) != main_alg)]
            entry = {"benchmark": bench, "buffer": b}
            for role, method in (("main", h.method), ("baseline", base.loc[base["mean"].idxmax(), "method"] if len(base) else None)):
                if method is None:
                    continue
                ref_table, row = display.paper_row(method)
                own = at[at.method == method].buffer.iloc[0]           # b, or "none"
                t = task[(task.benchmark == bench) & (task.buffer.isin([b, "none"])) & (task.method == method)]["mean"]
                entry[role] = {"method": method, "label": display.label(method) + (" (no buffer)" if own != b else ""),
                               "class_il": float(at[at.method == method]["mean"].iloc[0]),
                               "class_il_std": float(at[at.method == method]["std"].iloc[0]),
                               "task_il": float(t.iloc[0]) if len(t) and pd.notna(t.iloc[0]) else None,
                               "paper_class_il": paper_value(paper, ref_table or h.paper_table, "class_il", bench, row, own),
                               "paper_task_il": paper_value(paper, ref_table or h.task_paper_table, "task_il", bench, row, own)}
            out.append(entry)
    return out


def headline_metrics(rows: list[dict]) -> dict:
    """results/metrics.json: the few numbers `dvc exp show` / `dvc metrics diff` compare, per benchmark and
    buffer; no timings (they differ on every run)."""
    out: dict = {}
    for e in rows:
        cell = out.setdefault(e["benchmark"], {}).setdefault(e["buffer"], {})
        for role, key in (("main", e["main"]["method"]), ("baseline", "best_baseline")):
            if role not in e:
                continue
            r = e[role]
            entry = {"method": r["method"]} if role == "baseline" else {}
            entry["class_il"] = round(r["class_il"], 2)
            if r["task_il"] is not None:
                entry["task_il"] = round(r["task_il"], 2)
            cell[key] = entry
    return out


def headline_table(rows: list[dict]) -> str:
    lines = []
    tasks = any(e.get(r, {}).get("task_il") is not None for e in rows for r in ("main", "baseline"))
    for e in rows:
        m, b = e["main"], e.get("baseline")
        line = {"benchmark": e["benchmark"], "buffer": e["buffer"],
                f"{m['label']} ours": fmt_mean_std(m["class_il"], m["class_il_std"]),
                f"{m['label']} paper": fmt_number(m["paper_class_il"]),
                "best baseline": b["label"] if b else "-",
                "baseline ours": fmt_mean_std(b["class_il"], b["class_il_std"]) if b else "-",
                "baseline paper": fmt_number(b["paper_class_il"]) if b else "-"}
        if tasks:
            line[f"{m['label']} Task-IL"] = fmt_number(m["task_il"])
            line["baseline Task-IL"] = fmt_number(b["task_il"]) if b else "-"
        lines.append(line)
    return markdown(pd.DataFrame(lines))


# ---------------------------------------------------------------------------- tables.md

def data_lines(resolved: dict, summary: pd.DataFrame, benchmarks: list[str]) -> str:
    """Where each benchmark's numbers come from (caption, source, stream length) and the environments."""
    out = ["Data:\n"]
    for b in benchmarks:
        cfg = resolved["benchmarks"][b]
        samples = summary.loc[summary.benchmark == b, "samples"].dropna() if "samples" in summary else pd.Series([])
        stream = "" if samples.empty else (f", {int(samples.min()):,}" + (f"-{int(samples.max()):,}" if samples.max() > samples.min()
                                                                         else "") + " stream samples per seed")
        out.append(f"- **{b}**: {cfg.get('label') or cfg['source']} (source `{cfg['source']}`{stream})")
    envs = environments(summary)
    out.append("\nComputed on: " + "; ".join(envs) + (
        ". **These results mix environments**: another CPU or torch build moves a run's numbers within seed "
        "noise, so compare cells from one environment (summary.csv has each seed's)." if len(envs) > 1 else "."))
    return "\n".join(out) + "\n\n"


WITHIN_STD = "≈"   # marks our mean ± std when the paper's number lies within one seed-std of our mean


def render_profile(resolved: dict, settings: ReportSettings, summary: pd.DataFrame, paper: pd.DataFrame,
                   head: list[dict], h: str = "##") -> str:
    """One profile's sections: headline, data, the tables, method metrics and cost. `h` is their heading level."""
    display = Display(resolved, settings)
    out = io.StringIO()
    if head:
        main = display.label(settings.headline.method)
        out.write(f"{h} Headline: {main} against the best baseline (Class-IL)\n\n"
                  f"Best baseline: the method with the highest mean Class-IL at that buffer (or without a buffer), {main}'s own "
                  f"variants and {', '.join(map(display.label, settings.headline.exclude)) or 'none'} left out.\n\n")
        out.write(headline_table(head) + "\n\n")
    benchmarks = [b for b in resolved["benchmarks"] if b in set(summary.benchmark)]
    out.write(data_lines(resolved, summary, benchmarks))
    envs_of = {b: environments(summary[summary.benchmark == b]) for b in benchmarks}
    for spec in settings.tables:
        sections = []
        for b in table_benchmarks(spec, summary, resolved):
            present = set(summary[(summary.benchmark == b) & summary[spec.metric].notna()].method)
            if not table_rows(spec, display, present):
                continue
            if spec.rows is not None and len(present & set(spec.rows)) < 2:
                continue        # named rows (an ablation) with one configuration run compare nothing
            table, notes = accuracy_table(spec, summary, paper, display, b)
            shown = {m for _, m in table_rows(spec, display, present)}
            notes += [f"{display.label(run['method'])}, B={run['buffer']}: {text}" for key, text in
                      resolved.get("caveats", {}).items() if (run := resolved["runs"][key])["benchmark"] == b
                      and run["method"] in shown]
            mixed = envs_of[b]
            if len(mixed) > 1:
                notes = [f"its cells come from {len(mixed)} environments: " + "; ".join(mixed), *notes]
            if WITHIN_STD in table:
                notes = [f"{WITHIN_STD}: the paper's number lies within one seed-std of our mean.", *notes]
            sections.append(f"{h}# {b}\n\n" + "".join(f"- {n}\n" for n in notes) + ("\n" if notes else "")
                            + table + "\n\n")
        if sections:
            out.write(f"{h} {spec.title}\n\n" + (f"{spec.text}\n\n" if spec.text else "") + "".join(sections))
    extra = method_metrics_table(summary, display)
    if extra:
        out.write(f"{h} Method-specific metrics (mean over seeds)\n\n" + extra + "\n\n")
    out.write(f"{h} Forgetting and cost per run\n\n"
              "Forgetting: mean over evaluation groups (tasks; digits on MNIST-360) of the best earlier "
              "accuracy minus the final one. Steps: SGD steps of the stream per seed (the settings' batch decides "
              "them: compare rows at equal steps). Train seconds exclude evaluation.\n\n")
    out.write(cost_table(summary, display) + "\n")
    return out.getvalue()


def render_tables(resolved: dict, settings: ReportSettings, summary: pd.DataFrame, paper: pd.DataFrame,
                  head: list[dict], warnings: list[str], reproductions: list["Reproduction"] = ()) -> str:
    out = io.StringIO()
    out.write("# Results: our numbers beside the paper's\n\n")
    out.write("Mean ± std over seeds; accuracies in %. Generated by `dvc repro` (stage `report`) from the runs "
              "params.yaml lists" + (" and the committed results of the profiles in `report.reproductions`"
                                     if reproductions else "") + "; do not edit by hand.\n\n")
    if warnings:
        out.write("## Warnings\n\n" + "".join(f"- {w}\n" for w in warnings) + "\n")
    for rep in reproductions:
        out.write(f"## Reproduction: {rep.title}\n\n"
                  f"Seeds {rep.resolved['seeds']}. The results of another profile, run with `dvc repro` in a workspace "
                  f"of its own and committed in `{rep.folder}` (its params.yaml, dvc.lock and results/); docs/running.md "
                  "says how to regenerate them.\n\n")
        out.write(render_profile(rep.resolved, rep.settings, rep.summary, paper, rep.head, "###") + "\n")
    h = "##"
    if reproductions:
        out.write("## This profile (params.yaml)\n\n")
        h = "###"
    out.write(f"Seeds {resolved['seeds']}.\n\n")
    out.write(render_profile(resolved, settings, summary, paper, head, h))
    return out.getvalue()


# ---------------------------------------------------------------------------- writing

def write_report(resolved: dict, out_dir: str | Path, paper_csvs: list[str | Path]) -> list[str]:
    """Build every output in a temporary folder beside `out_dir`; move them into place only when all
    succeeded. Returns the warnings (also printed and listed at the top of tables.md)."""
    out_dir = Path(out_dir)
    settings = ReportSettings.model_validate(resolved.get("report") or {})
    display = Display(resolved, settings)
    cells = load_cells(resolved)
    summary = summary_frame(cells)
    paper = read_paper(paper_csvs)
    reproductions = [read_reproduction(f, paper) for f in settings.reproductions]
    warnings: list[str] = []
    for folder in stale_runs(resolved):
        warn(f"stale: {folder} is not a run of params.yaml; delete it", warnings)
    out_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(out_dir)             # what a killed report left
    build = Path(tempfile.mkdtemp(prefix=".report.", suffix=".tmp", dir=out_dir))
    try:
        with writing(out_dir, build):    # a full disk names results/<file>, not the build folder that goes
            (build / "figures").mkdir()
            (build / "plots").mkdir()
            write_plot_data(resolved, settings, cells, build / "plots")
            if settings.figures:
                draw_all(resolved, settings, display, cells, build / "figures", warnings)
            head = headline(summary, paper, display)
            summary.to_csv(build / "summary.csv", index=False)
            (build / "metrics.json").write_text(json.dumps(headline_metrics(head), indent=2, allow_nan=False) + "\n")
            (build / "tables.md").write_text(render_tables(resolved, settings, summary, paper, head, warnings,
                                                         reproductions))
        for name in OUTPUTS:
            dest = out_dir / name
            if dest.is_dir():
                shutil.rmtree(dest)
            elif dest.exists():
                dest.unlink()
            os.replace(build / name, dest)
    finally:
        shutil.rmtree(build, ignore_errors=True)
    return warnings
