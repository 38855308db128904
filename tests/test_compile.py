"""Compiled backbones (torch.compile; CUDA graphs on a GPU): the same training as eager, only where it is safe.

CUDA graphs need a GPU, which CI does not have; these tests run the same compiled path on the CPU. With
the `aot_eager` backend (dynamo's graph capture and AOT autograd, without code generation) a compiled step
must match the eager one bit for bit; with inductor (generated C++ kernels) to rounding.
"""
import copy
import functools
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from gcl.core import backbones
from gcl.core.backbones import MLP, ResNet18, compiled_extract
from gcl.core.errors import UserError
from gcl.data.transforms import to_unit_float
from gcl.methods import METHODS, MethodContext
from gcl.training import compilation
from gcl.training.compilation import compile_mode
from gcl.training.loop import EAGER_STEPS
from gcl.training.train import run_seed
from helpers import run_settings, synthetic_source

CPU = torch.device("cpu")
ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {"sgd": {}, "er": {"replay_batch": 6}, "er-ace": {"replay_batch": 6},
            "derpp": {"replay_batch": 6, "alpha": 0.3, "beta": 0.5}, "coca": {"replay_batch": 6},
            "clser": {"replay_batch": 6}}


@pytest.fixture
def counted_aot_eager(monkeypatch):
    """Compile with dynamo + AOT autograd (no code generation, so exact), counting the compiled calls."""
    calls = []

    def compile_extractor(fn, mode):
        compiled = torch.compile(fn, backend="aot_eager", dynamic=None)   # as compile_extractor

        def counted(*args):
            calls.append(args[1].shape)
            return compiled(*args)
        return counted

    monkeypatch.setattr(backbones, "compile_extractor", compile_extractor)
    compiled_extract.cache_clear()
    yield calls
    compiled_extract.cache_clear()
    torch._dynamo.reset()


def make(name: str, net: torch.nn.Module, mode: str | None):
    torch.manual_seed(0)
    net.compile_mode = mode
    cls = METHODS[name]
    cfg = run_settings(name, 20 if cls.uses_buffer else "none", **{"lr": 0.05, "batch": 5, **SETTINGS[name]})
    ctx = MethodContext(device=CPU, n_classes=10, train_transform=to_unit_float,
                        generator=torch.Generator().manual_seed(0), plain_transform=to_unit_float)
    return cls(net, cfg, ctx)


def train_both(name: str, build, steps: int = 12):
    """The same method, data and random numbers, once eager and once compiled: (losses, states) of each."""
    src = synthetic_source(per_class=8)
    order = torch.randperm(len(src["train_y"]), generator=torch.Generator().manual_seed(1))
    out = []
    for mode in (None, "default"):
        torch.manual_seed(0)
        net = build()
        m = make(name, net, mode)
        torch.manual_seed(2)   # the method's own random draws (augmentations, pretext) start alike
        losses = []
        for step in range(steps):
            idx = order[step * 5:(step + 1) * 5]
            x_raw, y = src["train_x"][idx], src["train_y"][idx]
            if x_raw.shape[1:] != net_input(net):
                x_raw = F.interpolate(x_raw.float(), size=net_input(net)[1:]).to(torch.uint8).expand(-1, 3, -1, -1)
            losses.append(m.observe(to_unit_float(x_raw), y, x_raw))
        out.append((torch.stack(losses), m.state_dict()))
    return out


def net_input(net):
    return (1, 28, 28) if isinstance(net, MLP) else (3, 8, 8)


def assert_same_state(a, b, exact: bool):
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same_state(a[k], b[k], exact)
    elif isinstance(a, torch.Tensor):
        if exact:
            assert torch.equal(a, b)
        else:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    else:
        assert a == b


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_a_compiled_mlp_trains_exactly_as_the_eager_one(name, counted_aot_eager):
    (eager_loss, eager_state), (compiled_loss, compiled_state) = train_both(name, lambda: MLP((1, 28, 28), 10))
    assert counted_aot_eager, "the compiled extractor was never called"
    assert torch.equal(eager_loss, compiled_loss)
    assert_same_state(eager_state, compiled_state, exact=True)


@pytest.mark.slow
def test_batchnorm_statistics_move_alike_through_a_compiled_resnet(counted_aot_eager):
    """ResNet-18's running statistics are updated in place inside the compiled graph: they must end alike."""
    (eager_loss, eager_state), (compiled_loss, compiled_state) = train_both(
        "derpp", lambda: ResNet18((3, 8, 8), 10), steps=4)
    assert len(counted_aot_eager) >= 4 * 2   # stream and buffer batches, one forward each (BatchNorm)
    torch.testing.assert_close(eager_loss, compiled_loss, rtol=1e-5, atol=1e-6)
    assert_same_state(eager_state, compiled_state, exact=False)
    assert not torch.equal(eager_state["net"]["stem.1.running_mean"], torch.zeros(64))


@pytest.mark.slow
@pytest.mark.skipif(not (shutil.which("g++") or shutil.which("clang++")), reason="inductor's CPU kernels need a C++ compiler")
def test_inductor_kernels_train_as_eager_to_rounding():
    """The real CPU code path (generated C++ kernels): the same training up to floating-point rounding."""
    compiled_extract.cache_clear()
    try:
        (eager_loss, eager_state), (compiled_loss, compiled_state) = train_both(
            "er", lambda: MLP((1, 28, 28), 10), steps=6)
    finally:
        compiled_extract.cache_clear()
        torch._dynamo.reset()
    torch.testing.assert_close(eager_loss, compiled_loss, rtol=1e-5, atol=1e-6)
    assert_same_state(eager_state, compiled_state, exact=False)


def test_evaluation_and_no_grad_passes_stay_eager(counted_aot_eager):
    net = MLP((1, 28, 28), 10)
    net.compile_mode = "default"
    x = torch.rand(3, 1, 28, 28)
    net.eval()
    net(x)
    net.train()
    with torch.no_grad():
        net(x)
    assert counted_aot_eager == []
    net(x).sum().backward()
    assert counted_aot_eager == [x.shape]


def test_a_copy_of_a_compiled_network_computes_with_its_own_weights(counted_aot_eager):
    """The compiled function takes the network as an argument: a deep copy (LwF's old network, CLS-ER's memories)
    must not call back into the network it was copied from."""
    net = MLP((1, 28, 28), 10)
    net.compile_mode = "default"
    x = torch.rand(4, 1, 28, 28)
    net(x)
    twin = copy.deepcopy(net)
    with torch.no_grad():
        for p in twin.parameters():
            p.mul_(-2.0)
    assert torch.equal(twin(x), twin.classifier(twin.extract(x)))
    assert not torch.allclose(twin(x), net(x))


def test_compile_mode_follows_the_setting_the_device_and_the_method(monkeypatch):
    er, gss = METHODS["er"], METHODS["gss"]
    cuda = torch.device("cuda")
    monkeypatch.setattr(compilation, "triton_available", lambda device: True)
    monkeypatch.setattr(compilation, "compiler_failure", lambda device: None)
    assert compile_mode("auto", CPU, er) is None            # a CPU run stays eager (and identical to before)
    assert compile_mode("auto", cuda, er) == "reduce-overhead"
    assert compile_mode(True, CPU, er) == "default"
    assert compile_mode(False, cuda, er) is None
    assert compile_mode(True, cuda, gss) is None             # vmap'd per-sample gradients: never compiled
    assert {n for n, c in METHODS.items() if c.capturable} == {
        "sgd", "joint", "er", "er-ace", "der", "derpp", "coca", "clser"}
    # a GPU without Triton: auto trains eager; an explicit true says what is missing
    monkeypatch.setattr(compilation, "triton_available", lambda device: False)
    assert compile_mode("auto", cuda, er) is None
    with pytest.raises(UserError, match="compile: true needs Triton on this GPU"):
        compile_mode(True, cuda, er)
    assert compile_mode(True, cuda, gss) is None


@pytest.mark.slow
def test_a_compiled_seed_scores_as_the_eager_one_and_says_so(tiny_mnist360, counted_aot_eager):
    bench, cfg = tiny_mnist360
    run = run_settings("er", 50, lr=0.1, batch=4, replay_batch=8)
    eager = run_seed(bench, cfg, run, 0, CPU, compiled=compile_mode(cfg.compile, CPU, METHODS["er"]))
    compiled = run_seed(bench, cfg, run, 0, CPU, compiled=compile_mode(True, CPU, METHODS["er"]))
    # one forward per step (stream + replayed batch together), compiled from the loop's step EAGER_STEPS on: the
    # buffer's filling steps, each with another replayed size, are never compiled
    assert len(counted_aot_eager) == compiled.steps - EAGER_STEPS > 0
    assert len(set(counted_aot_eager)) <= 2   # the full batch and a segment's last, shorter one
    assert compiled.acc_matrix == eager.acc_matrix and compiled.loss_curve == eager.loss_curve
    assert eager.environment["compiled"] == "eager" and compiled.environment["compiled"] == "default"


@pytest.mark.slow
def test_bf16_autocast_reaches_inside_the_compiled_graph(tiny_mnist360, counted_aot_eager):
    """bf16 autocast is entered around each step; the compiled passes must run under it as the eager ones do."""
    bench, cfg = tiny_mnist360
    run = run_settings("er", 50, lr=0.1, batch=4, replay_batch=8)
    bf16, mode = cfg.model_copy(update={"bf16": True}), compile_mode(True, CPU, METHODS["er"])
    eager = run_seed(bench, bf16, run, 0, CPU)
    compiled = run_seed(bench, bf16, run, 0, CPU, compiled=mode)
    fp32 = run_seed(bench, cfg, run, 0, CPU, compiled=mode)
    assert counted_aot_eager
    assert compiled.loss_curve == eager.loss_curve and compiled.acc_matrix == eager.acc_matrix
    assert compiled.loss_curve != fp32.loss_curve


def test_a_stream_of_more_batch_sizes_than_the_graph_limit_stays_compiled(monkeypatch):
    """MNIST-360's segments end in batches of many sizes (9-12 in the profiles' streams), more than dynamo's 8
    graphs per function: with fixed shapes the ninth size on ran eagerly. The batch dimension becomes symbolic
    after the second size, so 13 sizes take 2 graphs and none falls back."""
    from torch._dynamo.testing import CompileCounterWithBackend

    counter = CompileCounterWithBackend("aot_eager")
    real_compile = torch.compile
    monkeypatch.setattr(backbones.torch, "compile",
                        lambda fn, mode=None, **options: real_compile(fn, backend=counter, **options))
    compiled_extract.cache_clear()
    torch._dynamo.reset()
    try:
        net = MLP((1, 28, 28), 10)
        net.compile_mode = "default"
        sizes = list(range(1, 14)) + [4, 16, 3]
        for n in sizes:
            net(torch.rand(n, 1, 28, 28)).sum().backward()
    finally:
        compiled_extract.cache_clear()
        torch._dynamo.reset()
    limit = getattr(torch._dynamo.config, "recompile_limit", None) or torch._dynamo.config.cache_size_limit
    assert len(set(sizes)) > limit
    assert counter.frame_count == 2


def test_a_broken_triton_trains_eager_with_one_line_or_stops_with_one(monkeypatch, capsys):
    """Triton installed but broken: auto falls back to eager with one line on stderr; true stops with one line."""
    er, cuda = METHODS["er"], torch.device("cuda")
    monkeypatch.setattr(compilation, "triton_available", lambda device: True)
    monkeypatch.setattr(compilation, "compiler_failure", lambda device: "ImportError: libcuda.so cannot be found")
    compilation._say_once.cache_clear()
    assert compile_mode("auto", cuda, er) is None
    assert compile_mode("auto", cuda, er) is None
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["compile: auto trains eager: torch.compile fails on cuda (ImportError: libcuda.so cannot be found)"]
    with pytest.raises(UserError, match="compile: true, but torch.compile fails on cuda .*repair Triton"):
        compile_mode(True, cuda, er)


def test_the_compiler_probe_reports_a_failure_in_one_line(monkeypatch):
    from gcl.core import devices

    def broken(*args, **kwargs):
        raise RuntimeError("triton: cannot build the launcher\nlong details")

    monkeypatch.setattr(devices.torch, "compile", broken)
    devices.compiler_failure.cache_clear()
    try:
        assert devices.compiler_failure(CPU) == "RuntimeError: triton: cannot build the launcher"
    finally:
        devices.compiler_failure.cache_clear()


def stack_true_params(device: str, compile_setting, method: str = "er") -> dict:
    """A profile of one run on the MLP with stack: true, its device and its benchmark's compile as given."""
    bench = {"kind": "mnist-360", "source": "synthetic", "backbone": "mlp", "epochs": 1, "stack": True,
             "compile": compile_setting}
    run = {"benchmark": "mnist-360", "method": method, "buffer": 50, "lr": 0.1, "batch": 4, "replay_batch": 8}
    return {"seeds": [0, 1], "device": device, "sources": {"synthetic": {}}, "benchmarks": {"mnist-360": bench},
            "methods": {method: {}}, "runs": {"run": run}}


@pytest.mark.parametrize("device, compile_setting", [("auto", "auto"), ("cuda", "auto"), ("cuda:1", "auto"),
                                                     ("cpu", True), ("auto", True)])
def test_stacking_and_compiling_together_are_refused_at_check_runs(device, compile_setting):
    """A compiled run does not stack: `stack: true` where the run may compile (`compile: auto` on a device that may be
    a GPU, or `compile: true`) stops check@runs with one line, rather than training unstacked without a word."""
    from gcl.config import ParamsError, resolve_run
    with pytest.raises(ParamsError, match="stack is true, but its seeds cannot train stacked: compile: .* compiles its "
                                          r"backbone.*compiled seeds do not stack \(the benchmark's compile: false"):
        resolve_run(stack_true_params(device, compile_setting), "run")


@pytest.mark.parametrize("device, compile_setting, method", [("cpu", "auto", "er"), ("auto", False, "er"),
                                                             ("cuda", False, "er"), ("auto", "auto", "agem")])
def test_stacking_where_the_run_stays_eager_passes_check_runs(device, compile_setting, method):
    """Eager wherever it runs: auto on the CPU, compile: false, or a method that is never compiled (A-GEM)."""
    from gcl.config import resolve_run
    assert resolve_run(stack_true_params(device, compile_setting, method), "run").benchmark.stack is True


# The compile check: a profile's run trained for the first steps of its stream twice through the training loop, eager
# and compiled, from the same network and random numbers (gcl.bench.compiled.train; `python -m gcl.bench compile` times
# the same two passes). The eager steps before the first compiled one are identical, so the first compiled step's loss
# may differ from the eager one by rounding only.
TOLERANCE = 1e-3      # the largest relative difference of the first compiled step's loss


def eager_and_compiled(spec, bench: dict, device: torch.device, steps: int, warmup: int):
    """The losses of the steps a compiled backbone runs (from the loop's EAGER_STEPS on), eager and compiled, and
    their relative differences."""
    from gcl.bench.compiled import train
    eager, compiled = (train(spec, bench, device, c, steps, warmup)["losses"][EAGER_STEPS:] for c in (False, True))
    return eager, compiled, (eager - compiled).abs() / eager.abs().clamp(min=1e-12)


def test_the_compile_check_passes_a_faithful_compile_and_catches_a_wrong_one(monkeypatch):
    from gcl.bench.common import random_benchmark
    from gcl.config import resolve_run
    from gcl.data.random_sources import MNIST_PIXELS, SourceShape, random_source
    from image_fixtures import SEQ_BENCHMARK
    params = {"seeds": [0], "device": "cpu", "sources": {"mnist-bundled": {}},
              "benchmarks": {"b": {**SEQ_BENCHMARK, "epochs": 3}}, "methods": {"er": {}},
              "runs": {"b-er-20": {"benchmark": "b", "method": "er", "buffer": 20, "lr": 0.1, "batch": 4,
                                   "replay_batch": 4}}}
    spec = resolve_run(params, "b-er-20")
    bench = random_benchmark(spec.data, random_source(SourceShape(10, 12, 3, (1, 28, 28), MNIST_PIXELS)))
    faithful = lambda fn, mode: torch.compile(fn, backend="aot_eager", dynamic=False)
    wrong = lambda fn, mode: lambda net, x: 1.5 * fn(net, x)    # what a stale or mis-captured graph would do
    try:
        monkeypatch.setattr(backbones, "compile_extractor", faithful)
        compiled_extract.cache_clear()
        eager, compiled, rel = eager_and_compiled(spec, bench, CPU, steps=30, warmup=25)
        assert len(eager) == 30 - EAGER_STEPS and rel.max() == 0.0 and torch.equal(eager[-5:], compiled[-5:])
        monkeypatch.setattr(backbones, "compile_extractor", wrong)
        compiled_extract.cache_clear()
        _, _, rel = eager_and_compiled(spec, bench, CPU, steps=30, warmup=25)
        assert rel[0] > TOLERANCE
    finally:
        compiled_extract.cache_clear()
        torch._dynamo.reset()


@pytest.fixture
def deterministic_kernels(monkeypatch):
    """Deterministic kernels and no TF32, so that two passes from the same network and inputs stay identical through
    their eager steps on a GPU (with CUDA's usual kernels they drift apart there already: docs/performance.md).
    cuBLAS reads its workspace setting at its first use: run these tests in a process of their own (tools/gpucheck.sh)."""
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    saved = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    torch.use_deterministic_algorithms(True, warn_only=True)   # warn where a kernel has no deterministic version
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
    torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved[2:]


@functools.lru_cache(maxsize=1)
def paper_seq_cifar10() -> tuple[dict, dict]:
    """profiles/paper.yaml and its seq-cifar10 benchmark built from random images of CIFAR-10's real shape and counts."""
    from gcl.bench.common import random_benchmark
    from gcl.config import load_params, resolve_run
    from gcl.data.random_sources import random_source, shape_of
    params = load_params(ROOT / "profiles" / "paper.yaml")
    key = next(k for k, r in params["runs"].items() if r["benchmark"] == "seq-cifar10")
    data = resolve_run(params, key).data
    return params, random_benchmark(data, random_source(shape_of(params, data.source)))


@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled step on a GPU (CUDA graphs) needs one")
@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("method", ["er", "derpp", "coca", "clser"])
def test_on_the_gpu_a_compiled_run_trains_as_the_eager_one(method, bf16, deterministic_kernels):
    """The paper profile's seq-cifar10 run of `method` (its largest buffer) on real-sized random images, 300 steps
    each way with CUDA graphs, as `python -m gcl.bench compile` trains them."""
    from gcl.bench.common import cells_of
    from gcl.config import resolve_run
    params, bench = paper_seq_cifar10()
    (keys,) = cells_of(params, ["seq-cifar10"], [method]).values()
    spec = resolve_run(params, keys[0])
    spec = spec.model_copy(update={"benchmark": spec.benchmark.model_copy(update={"bf16": bf16})})
    eager, compiled, rel = eager_and_compiled(spec, bench, torch.device("cuda"), steps=300, warmup=40)
    tail = min(50, len(eager))
    assert rel[0] <= TOLERANCE, (f"{keys[0]}: first compiled loss {compiled[0]:.6g} against eager {eager[0]:.6g}; "
                                 f"largest relative difference over 10 steps {rel[:10].max():.3g}; last {tail} steps' "
                                 f"mean {compiled[-tail:].mean():.6g} against {eager[-tail:].mean():.6g}")
