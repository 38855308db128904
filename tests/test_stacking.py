"""Seeds trained stacked (gcl.training.stacking) against the same seeds trained alone (run_seed), in float64:
every seed's loss curve, accuracies after each evaluation, confusion matrix and final weights agree to 1e-9,
through the buffer's filling and the whole MNIST-360 stream."""
import pytest
import torch

from gcl.core.seeds import Seeds
from gcl.methods import METHODS
from gcl.methods.base import Method
from gcl.training.stacking import unstackable
from gcl.training.train import run_seed, setup_seed, train_stacked
from helpers import run_settings
from test_stacked import stack_independent_kernels

CPU = torch.device("cpu")
SEEDS = [0, 1, 2]
RUNS = {"sgd": run_settings("sgd", lr=0.1, batch=4),
        "er": run_settings("er", 30, lr=0.1, batch=4, replay_batch=6),
        "er-ace": run_settings("er-ace", 30, lr=0.1, batch=4, replay_batch=6),
        "der": run_settings("der", 30, lr=0.1, batch=4, replay_batch=6, alpha=0.5),
        "derpp": run_settings("derpp", 30, lr=0.1, batch=4, replay_batch=6, alpha=0.3, beta=0.7),
        "derpp-split": run_settings("derpp", 30, lr=0.1, batch=4, replay_batch=6, alpha=0.3, beta=0.7,
                                    replay_draw="split"),
        "er-separate": run_settings("er", 30, lr=0.1, batch=4, replay_batch=6, replay_pass="separate"),
        "joint": run_settings("joint", lr=0.1, batch=4),
        "agem": run_settings("agem", 30, lr=0.1, batch=4, replay_batch=6),
        "agem-replay": run_settings("agem", 30, lr=0.1, batch=4, replay_batch=6, reference_input="replay"),
        "clser": run_settings("clser", 30, lr=0.1, batch=4, replay_batch=6, reg_weight=0.3,
                              plastic_update_freq=0.6, stable_update_freq=0.3, plastic_alpha=0.9, stable_alpha=0.95),
        "clser-working": run_settings("clser", 30, lr=0.1, batch=4, replay_batch=6, evaluated_model="working"),
        # CoCa: the full method, and every row of Table 3 with the settings the paper and the authors' code differ on
        "coca": run_settings("coca", 30, lr=0.05, batch=4, replay_batch=6),
        "coca-base": run_settings("coca", 30, lr=0.05, batch=4, replay_batch=6, ckd=False, pt=False, scl=False),
        "coca-ckd-code-backbone": run_settings("coca", 30, lr=0.05, batch=4, replay_batch=6, pt=False, scl=False,
                                               affinity="code", ckd_embedding="backbone", gamma=0.01),
        "coca-pt-rotation": run_settings("coca", 30, lr=0.05, batch=4, replay_batch=6, ckd=False, scl=False,
                                         pretext="rotation"),
        "coca-scl": run_settings("coca", 30, lr=0.05, batch=4, replay_batch=6, ckd=False, pt=False, beta=0.5),
        "coca-ckd-pt": run_settings("coca", 30, lr=0.05, batch=4, replay_batch=6, scl=False),
        "coca-ckd-scl": run_settings("coca", 30, lr=0.05, batch=4, replay_batch=6, pt=False, omega=0.3),
        "coca-pt-scl": run_settings("coca", 30, lr=0.05, batch=4, replay_batch=6, ckd=False)}


@pytest.fixture
def float64():
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(before)


def relative_close(a, b) -> bool:
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    if b.numel() == 0:
        return a.shape == b.shape
    return torch.allclose(a, b, rtol=1e-9, atol=1e-9 * max(1.0, float(b.abs().max())))


def numbers(result) -> list[float]:
    """A seed's loss curve and accuracies (JOINT has no loss curve: it is scored once, after its offline passes)."""
    return result.loss_curve + [a for row in result.acc_matrix for a in row]


def final_state(setup) -> list[torch.Tensor]:
    """A seed's network weights, then those of its method's own modules (CoCa's heads, CLS-ER's memories)."""
    modules = [setup.net] + [m for name in setup.method.state_attrs
                             if isinstance(m := getattr(setup.method, name), torch.nn.Module)]
    return [p.detach().clone() for m in modules for p in m.parameters()]


class _Quiet:
    def due(self):
        return False

    def report(self, *args):
        pass


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", sorted(RUNS))
def test_stacked_seeds_train_exactly_as_each_seed_alone(tiny_mnist360, float64, algorithm):
    bench, cfg = tiny_mnist360
    run = RUNS[algorithm]
    assert unstackable(cfg, run) is None
    stacked = train_stacked(bench, cfg, run, SEEDS, CPU)
    for seed in SEEDS:
        alone = run_seed(bench, cfg, run, seed, CPU)
        together = stacked[seed]
        assert together.environment["stacked"] == len(SEEDS) and "stacked" not in alone.environment
        assert together.steps == alone.steps and len(alone.acc_matrix) == (1 if algorithm == "joint" else 27)
        assert relative_close(together.loss_curve, alone.loss_curve), seed
        assert relative_close(together.acc_matrix, alone.acc_matrix), seed
        assert together.confusion == alone.confusion
        assert together.class_il == pytest.approx(alone.class_il, rel=1e-9)
    # the seeds differ from each other (each trained on its own stream, from its own initial weights)
    assert len({str(stacked[s].acc_matrix) + str(stacked[s].loss_curve) for s in SEEDS}) == len(SEEDS)


@pytest.mark.slow
@pytest.mark.parametrize("key", ["er", "coca", "clser"])
def test_a_stacked_seeds_final_state_comes_back_to_its_own_network_and_method(tiny_mnist360, float64, monkeypatch,
                                                                            key):
    """The stacked trainer copies each seed's weights back into that seed's own network, and its method's own
    modules (CoCa's heads, CLS-ER's memories) into its own method: seen through them, equal to the lone run's; and
    each seed's part of the stacked buffer holds what its lone buffer holds."""
    import gcl.training.stacking as module
    bench, cfg = tiny_mnist360
    run = RUNS[key]
    kept, original = {}, module.setup_seed
    groups, original_stack = [], Method.stack

    def keeping(*args, **kwargs):
        kept[args[3]] = original(*args, **kwargs)
        return kept[args[3]]

    def keeping_group(self, lone):
        original_stack(self, lone)
        groups.append(self)
    monkeypatch.setattr(module, "setup_seed", keeping)
    monkeypatch.setattr(Method, "stack", keeping_group)
    train_stacked(bench, cfg, run, [0, 1], CPU)
    [group] = groups
    for s, seed in enumerate((0, 1)):
        alone = setup_seed(bench, cfg, run, seed, CPU)
        alone.loop.run(progress=_Quiet())
        mine, theirs = final_state(kept[seed]), final_state(alone)
        assert len(mine) == {"er": 6, "coca": 6 + 8, "clser": 3 * 6}[key]
        assert all(relative_close(a, b) for a, b in zip(mine, theirs))
        # the buffer too: the same samples in the same slots (CoCa's stored logits to rounding)
        buffer, lone_buffer = group.buffer.seed_state(s), alone.method.buffer.state_dict()
        assert buffer["seen"] == lone_buffer["seen"] and set(buffer["fields"]) == set(lone_buffer["fields"])
        for name, field in buffer["fields"].items():
            assert relative_close(field, lone_buffer["fields"][name]), (seed, name)


def test_a_leak_between_seeds_is_caught(tiny_mnist360, float64, monkeypatch):
    """The equivalence fails when one seed's buffer decisions come from another seed's generator."""
    bench, cfg = tiny_mnist360
    run = RUNS["er"]
    original = Method.stack

    def leaky(self, lone):
        original(self, lone)
        self.buffer.generators[1] = self.buffer.generators[0]       # seed 1 draws from seed 0's generator
    monkeypatch.setattr(METHODS["er"], "stack", leaky)
    stacked = train_stacked(bench, cfg, run, SEEDS, CPU)
    assert relative_close(stacked[2].loss_curve, run_seed(bench, cfg, run, 2, CPU).loss_curve)
    assert not relative_close(stacked[1].loss_curve, run_seed(bench, cfg, run, 1, CPU).loss_curve)


@pytest.mark.slow
@pytest.mark.parametrize("key", ["coca-pt-rotation", "clser", "joint"])
def test_a_leak_of_a_methods_own_draws_between_seeds_is_caught(tiny_mnist360, float64, monkeypatch, key):
    """Each seed draws CoCa's transformations, CLS-ER's memory updates and JOINT's shuffles from its own generator:
    seed 1 drawing from seed 0's (its buffer keeping its own) breaks seed 1 and only seed 1."""
    bench, cfg = tiny_mnist360
    run = RUNS[key]
    original = Method.stack

    def leaky(self, lone):
        original(self, lone)
        g = self.seeds.generators
        self.seeds = Seeds([g[0], g[0], g[2]], stacked=True)   # the buffer keeps its own
    monkeypatch.setattr(METHODS[run.algorithm], "stack", leaky)
    stacked = train_stacked(bench, cfg, run, SEEDS, CPU)
    assert relative_close(numbers(stacked[2]), numbers(run_seed(bench, cfg, run, 2, CPU)))
    assert not relative_close(numbers(stacked[1]), numbers(run_seed(bench, cfg, run, 1, CPU)))


def test_what_does_not_stack_says_why(tiny_mnist360):
    bench, cfg = tiny_mnist360
    assert "gem: it solves a quadratic programme" in \
        unstackable(cfg, run_settings("gem", 30, lr=0.1, batch=4))
    with pytest.raises(ValueError, match="cannot stack"):
        train_stacked(bench, cfg, run_settings("gem", 30, lr=0.1, batch=4), [0, 1], CPU)


def test_in_float32_each_path_is_deterministic_and_the_two_agree_closely(tiny_mnist360):
    """float32: the batched and the lone kernels round differently, so a stacked seed is not its lone run bit for
    bit; each path gives the same numbers again on the same machine."""
    bench, cfg = tiny_mnist360
    run = RUNS["er"]
    first, second = (train_stacked(bench, cfg, run, [0, 1], CPU) for _ in range(2))
    assert all(first[s].acc_matrix == second[s].acc_matrix and first[s].loss_curve == second[s].loss_curve
               for s in (0, 1))
    alone = run_seed(bench, cfg, run, 0, CPU)
    assert first[0].loss_curve[0] == pytest.approx(alone.loss_curve[0], rel=1e-4)


@pytest.mark.slow
@stack_independent_kernels
@pytest.mark.parametrize("key", ["derpp", "coca", "clser", "agem", "joint"])
def test_a_seeds_numbers_do_not_depend_on_the_seeds_stacked_beside_it(tiny_mnist360, key):
    """float32 on the CPU: seed 0 alone in a stack, first of two, second of two, or among five gives the same numbers,
    so how a run's seeds are grouped (by its workers) stays a matter of speed."""
    bench, cfg = tiny_mnist360
    run = RUNS[key]
    results = [train_stacked(bench, cfg, run, group, CPU)[0] for group in ([0], [0, 1], [1, 0], [3, 0, 1, 2, 4])]
    assert all(r.loss_curve == results[0].loss_curve and r.acc_matrix == results[0].acc_matrix for r in results)


def image_bytes_allocated(train, like: torch.Tensor) -> int:
    """The bytes of the new tensors of `like`'s dtype and at least its size (copies of a pool of images) that the
    torch operations of `train()` allocate."""
    from torch.utils._python_dispatch import TorchDispatchMode
    seen, total = {like.untyped_storage().data_ptr()}, [0]

    class Allocations(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in (out if isinstance(out, (tuple, list)) else [out]):
                if isinstance(t, torch.Tensor) and t.dtype == like.dtype and t.numel() >= like.numel():
                    storage = t.untyped_storage()
                    if storage.data_ptr() not in seen:
                        seen.add(storage.data_ptr())
                        total[0] += storage.nbytes()
            return out
    with Allocations():
        train()
    return total[0]


def test_a_stacked_group_holds_one_copy_of_a_pool_its_seeds_share():
    """A sequential benchmark hands every seed the same pool (each seed orders it its own way): a stacked group
    holds it once, so it takes less than one pool more per added seed (it stacked one copy a seed: about 12 GB at 5
    seeds of Tiny ImageNet on a GPU, where each seed's setup copied it once more)."""
    from gcl.data import sequential
    from helpers import sequential_settings, synthetic_source
    settings = sequential_settings()
    bench = sequential.build_benchmark(synthetic_source(per_class=8, test_per_class=2), settings.data())
    bench["config"] = settings.data().model_dump(mode="json")
    cfg, pool = settings.training(), bench["train_x"]
    one, three = (image_bytes_allocated(lambda n=n: train_stacked(bench, cfg, RUNS["er"], list(range(n)), CPU), pool)
                  for n in (1, 3))
    pool_bytes = pool.untyped_storage().nbytes()
    assert three - one < 2 * pool_bytes, f"3 seeds took {three} bytes of images, 1 seed {one}; a pool is {pool_bytes}"
