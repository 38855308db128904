"""Seeds stacked on the ResNet-18 (gcl.core.stacked_resnet): grouped convolutions and per-seed BatchNorms give
each seed, in float64, what its own network gives it; a stacked run on an augmented sequential benchmark equals
each seed's lone run (losses, accuracies, confusion, final weights and BatchNorm estimates), through the
buffer's filling and a task boundary; each seed's crops and flips are its own."""
import pytest
import torch
import torch.nn.functional as F

from gcl.core.backbones import ResNet18
from gcl.core.stacked import flat_seeds
from gcl.core.stacked_resnet import StackedResNet18, stack_networks
from gcl.data import sequential
from gcl.data.augment import SeedwiseTransform
from gcl.training.stacking import unstackable
from gcl.training.train import run_seed, setup_seed, train_stacked
from helpers import run_settings, sequential_settings, synthetic_source
from test_stacked import close, stack_independent_kernels
from test_stacking import _Quiet, final_state, float64, relative_close  # noqa: F401 (a fixture)

CPU = torch.device("cpu")
SEEDS = [0, 1, 2]
# two tasks of two classes, 6 images a class: 3 stream batches of 4 a task; a buffer of 6 full after 2 steps.
# Width 4 at 16x16: smaller (width 2 at 8x8, where the last stage is 1x1) BatchNorms normalise so few values
# that float64 rounding grows ten-fold a step, and lone runs themselves would not be reproducible to 1e-9
RUNS = {"sgd": run_settings("sgd", lr=0.05, batch=4),
        "joint": run_settings("joint", lr=0.05, batch=4),
        "er": run_settings("er", 6, lr=0.05, batch=4, replay_batch=6),
        "er-ace": run_settings("er-ace", 6, lr=0.05, batch=4, replay_batch=6),
        "agem": run_settings("agem", 6, lr=0.05, batch=4, replay_batch=6, reference_input="replay"),
        "der": run_settings("der", 6, lr=0.05, batch=4, replay_batch=6, alpha=0.5),
        "derpp": run_settings("derpp", 6, lr=0.05, batch=4, replay_batch=6, alpha=0.3, beta=0.7),
        "clser": run_settings("clser", 6, lr=0.05, batch=4, replay_batch=6, plastic_update_freq=0.6,
                              stable_update_freq=0.3),
        "coca": run_settings("coca", 6, lr=0.01, batch=4, replay_batch=6),             # BatchNorm heads (auto)
        "coca-pt-rotation": run_settings("coca", 6, lr=0.01, batch=4, replay_batch=6, scl=False, pretext="rotation",
                                         head_norm="none")}


@pytest.fixture
def tiny_cifar_like(float64):
    """Sequential, augmented (random crop with padding 4 and flips), ResNet-18 of width 4 on 16x16 inputs."""
    settings = sequential_settings(backbone="resnet18", width=4, input_size=16, augment=True, n_tasks=2)
    bench = sequential.build_benchmark(synthetic_source(per_class=6, test_per_class=2), settings.data())
    bench["config"] = settings.data().model_dump(mode="json")
    return bench, settings.training()


def lone_resnets(seeds: int = 3) -> list[ResNet18]:
    nets = []
    for seed in range(seeds):
        torch.manual_seed(seed)
        nets.append(ResNet18((3, 12, 12), 5, width=2))
    return nets


def test_a_stacked_resnet_computes_updates_and_unstacks_each_seed_as_alone(float64):
    nets = lone_resnets()
    stacked = stack_networks(nets)
    assert isinstance(stacked, StackedResNet18)
    assert [n for n, _ in stacked.state_dict().items()] == [n for n, _ in nets[0].state_dict().items()]
    g = torch.Generator().manual_seed(0)
    for _ in range(2):                  # two SGD steps, each seed on its own batch, BatchNorm in training mode
        x = torch.rand(3, 4, 3, 12, 12, generator=g)
        y = torch.randint(0, 5, (3, 4), generator=g)
        logits = stacked(x)
        lone = [net(x[s]) for s, net in enumerate(nets)]
        assert all(close(logits[s], lone[s]) for s in range(3))
        F.cross_entropy(flat_seeds(logits), flat_seeds(y), reduction="none").view(3, 4).mean(1).sum().backward()
        for s, net in enumerate(nets):
            F.cross_entropy(lone[s], y[s]).backward()
            assert close(stacked.stem[0].weight.grad[s], net.stem[0].weight.grad)
            assert close(stacked.layers[2].shortcut[0].weight.grad[s], net.layers[2].shortcut[0].weight.grad)
        with torch.no_grad():
            for module in (stacked, *nets):
                for p in module.parameters():
                    p -= 0.1 * p.grad
                    p.grad = None
    for s, net in enumerate(nets):        # weights and running estimates come back to each seed's own network
        copy = stacked.unstack(s, ResNet18((3, 12, 12), 5, width=2))
        assert all(close(a, b) for a, b in zip(copy.state_dict().values(), net.state_dict().values()))
    stacked.eval()
    for net in nets:
        net.eval()
    assert all(close(stacked(x)[s], net(x[s])) for s, net in enumerate(nets))


def test_what_does_not_stack_as_a_resnet_says_why():
    with pytest.raises(TypeError, match="ResNet18s"):
        StackedResNet18([])
    with pytest.raises(ValueError, match="channels_last"):
        StackedResNet18([ResNet18((3, 8, 8), 5, width=2, channels_last=True)])
    settings = sequential_settings(backbone="resnet18", channels_last=True)
    assert "memory layout" in unstackable(settings.training(), RUNS["er"])


@pytest.mark.parametrize("key", sorted(RUNS))
def test_stacked_resnet_seeds_train_exactly_as_each_seed_alone(tiny_cifar_like, key):
    bench, cfg = tiny_cifar_like
    run = RUNS[key]
    assert unstackable(cfg, run) is None
    stacked = train_stacked(bench, cfg, run, SEEDS, CPU)
    for seed in SEEDS:
        alone = run_seed(bench, cfg, run, seed, CPU)
        together = stacked[seed]
        assert together.steps == alone.steps == 6
        assert relative_close(together.loss_curve, alone.loss_curve), seed
        assert relative_close(together.acc_matrix, alone.acc_matrix), seed
        assert together.confusion == alone.confusion
    assert len({str(stacked[s].loss_curve) for s in SEEDS}) == (1 if key == "joint" else len(SEEDS))


@pytest.mark.parametrize("key", ["derpp", "clser", "coca"])
def test_a_stacked_resnet_seeds_final_state_is_its_lone_state(tiny_cifar_like, monkeypatch, key):
    """Weights, BatchNorm estimates, CoCa's heads and CLS-ER's memories, copied back to each seed's own network and
    method, equal those of its lone run."""
    import gcl.training.stacking as module
    bench, cfg = tiny_cifar_like
    kept, original = {}, module.setup_seed

    def keeping(*args, **kwargs):
        kept[args[3]] = original(*args, **kwargs)
        return kept[args[3]]
    monkeypatch.setattr(module, "setup_seed", keeping)
    train_stacked(bench, cfg, RUNS[key], [0, 1], CPU)
    for seed in (0, 1):
        alone = setup_seed(bench, cfg, RUNS[key], seed, CPU)
        alone.loop.run(progress=_Quiet())
        assert all(relative_close(a, b) for a, b in zip(final_state(kept[seed]), final_state(alone)))
        mine, theirs = kept[seed].net.state_dict(), alone.net.state_dict()
        assert all(relative_close(mine[k], theirs[k]) for k in theirs if "running" in k)


def test_a_leak_of_augmentation_draws_between_seeds_is_caught(tiny_cifar_like, monkeypatch):
    """Seed 1 drawing its crops and flips from seed 0's generator breaks seed 1 and only seed 1."""
    bench, cfg = tiny_cifar_like
    original = SeedwiseTransform.__init__

    def leaky(self, transform, generators):
        original(self, transform, generators)
        if generators:
            self.generators = [generators[0], generators[0], generators[2]]
    monkeypatch.setattr(SeedwiseTransform, "__init__", leaky)
    stacked = train_stacked(bench, cfg, RUNS["er"], SEEDS, CPU)
    assert relative_close(stacked[2].loss_curve, run_seed(bench, cfg, RUNS["er"], 2, CPU).loss_curve)
    assert not relative_close(stacked[1].loss_curve, run_seed(bench, cfg, RUNS["er"], 1, CPU).loss_curve)


def test_seedwise_augmentation_draws_each_seeds_own_crops():
    """Each seed's images cropped and flipped as a lone TrainAugment would with that seed's global generator."""
    from gcl.data.augment import Normalize, TrainAugment
    augment = TrainAugment(Normalize(None, None), padding=2)
    images = torch.randint(0, 256, (3, 5, 1, 6, 6), dtype=torch.uint8)
    generators = [torch.Generator().manual_seed(10 + s) for s in range(3)]
    out = SeedwiseTransform(augment, generators)(images)
    for s in range(3):
        torch.manual_seed(10 + s)
        assert torch.equal(out[s], augment(images[s]))


def test_auto_stacks_the_mlp_and_the_resnet_only_when_asked():
    from gcl.training.stacking import stacks
    resnet = sequential_settings(backbone="resnet18").training()
    assert not stacks(resnet, RUNS["er"], 3)                                   # auto: slower on a CPU
    assert stacks(resnet.model_copy(update={"stack": True}), RUNS["er"], 3)
    assert not stacks(resnet.model_copy(update={"stack": True}), RUNS["er"], 1)
    assert stacks(sequential_settings().training(), RUNS["er"], 3)             # the MLP


@pytest.mark.slow
@stack_independent_kernels
@pytest.mark.parametrize("key", ["er", "coca"])
def test_a_resnet_seeds_float32_numbers_do_not_depend_on_the_seeds_beside_it(key):
    """float32 on the CPU, at width 16: seed 0 alone in a stack, beside another seed either way round, or among
    five gives the same numbers, so grouping by workers, or a resumed run's regrouping, changes nothing. (Grouped,
    the CPU took other kernels for the stem's and a 1x1 shortcut's convolutions in larger stacks; the stacked
    convolution goes seed by seed on a CPU.)"""
    settings = sequential_settings(backbone="resnet18", width=16, input_size=16, augment=True, n_tasks=2)
    bench = sequential.build_benchmark(synthetic_source(per_class=6, test_per_class=2), settings.data())
    bench["config"] = settings.data().model_dump(mode="json")
    cfg, run = settings.training(), RUNS[key]
    results = [train_stacked(bench, cfg, run, group, CPU)[0] for group in ([0], [0, 1], [1, 0], [3, 0, 1, 2, 4])]
    assert all(r.loss_curve == results[0].loss_curve and r.acc_matrix == results[0].acc_matrix for r in results)
