"""Stacked seeds (gcl.core.stacked): S seeds as one network and one buffer give each seed, in float64, what it
gets alone: outputs, gradients, updates, buffer contents and replay draws."""
import pytest
import torch
import torch.nn.functional as F

from gcl.core.backbones import MLP
from gcl.core.buffer import ReservoirBuffer
from gcl.core.stacked import StackedMLP, StackedReservoir, flat_seeds, stack_sequential, unstack_sequential

S, B, CLASSES = 4, 5, 10
SHAPE = (1, 28, 28)


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal to 1e-9, relative to the larger magnitude (the float64 tolerance of the stacked path)."""
    return torch.allclose(a, b, rtol=1e-9, atol=1e-9 * max(1.0, float(b.detach().abs().max())))


def lone_nets() -> list[MLP]:
    nets = []
    for seed in range(S):
        torch.manual_seed(seed)           # each seed's network initialised as its lone run initialises it
        nets.append(MLP(SHAPE, CLASSES).double())
    return nets


def test_a_stacked_mlp_computes_updates_and_unstacks_each_seed_as_alone():
    nets = lone_nets()
    stacked = StackedMLP(nets)
    g = torch.Generator().manual_seed(0)
    for _ in range(3):                    # three SGD steps, each seed on its own batch
        x = torch.rand(S, B, *SHAPE, generator=g, dtype=torch.float64)
        y = torch.randint(0, CLASSES, (S, B), generator=g)
        logits = stacked(x)
        lone_logits = [net(x[s]) for s, net in enumerate(nets)]
        for s in range(S):
            assert close(logits[s], lone_logits[s])
        loss = F.cross_entropy(flat_seeds(logits), flat_seeds(y), reduction="none").view(S, B).mean(1).sum()
        lone_losses = [F.cross_entropy(out, y[s]) for s, out in enumerate(lone_logits)]
        assert close(loss, sum(lone_losses))
        stacked.zero_grad()
        loss.backward()
        for s, (net, lone) in enumerate(zip(nets, lone_losses)):
            net.zero_grad()
            lone.backward()
            assert close(stacked.fc1.weight.grad[s], net.body[1].weight.grad)
            assert close(stacked.classifier.bias.grad[s], net.classifier.bias.grad)
        with torch.no_grad():
            for p in stacked.parameters():
                p -= 0.1 * p.grad
            for net in nets:
                for p in net.parameters():
                    p -= 0.1 * p.grad
    for s, net in enumerate(nets):
        copy = stacked.unstack(s, MLP(SHAPE, CLASSES).double())
        for a, b in zip(copy.parameters(), net.parameters()):
            assert close(a, b)
        assert close(stacked.features(x)[s], net.features(x[s]))


def fill(buffers, stacked, generator, steps=12, batch=3):
    for step in range(steps):
        x = torch.randint(0, 255, (S, batch, 2), generator=generator, dtype=torch.uint8)
        y = torch.randint(0, CLASSES, (S, batch), generator=generator)
        stacked.add(examples=x, labels=y)
        for s, buffer in enumerate(buffers):
            buffer.add(examples=x[s], labels=y[s])


def test_a_stacked_reservoir_keeps_and_draws_what_each_seeds_lone_buffer_does():
    capacity = 7
    lone = [ReservoirBuffer(capacity, "cpu", torch.Generator().manual_seed(s)) for s in range(S)]
    stacked = StackedReservoir(capacity, "cpu", [torch.Generator().manual_seed(s) for s in range(S)])
    data = torch.Generator().manual_seed(99)
    fill(lone, stacked, data)
    assert len(stacked) == capacity and stacked.seen == 36
    for s, buffer in enumerate(lone):
        state = stacked.seed_state(s)
        assert state["seen"] == buffer.seen
        for name, field in buffer.fields.items():
            assert torch.equal(state["fields"][name], field)
    for size in (4, 20):                  # fewer than it holds, and more (all of them)
        x, y = stacked.sample(size, "examples", "labels")
        for s, buffer in enumerate(lone):
            bx, by = buffer.sample(size, "examples", "labels")
            assert torch.equal(x[s], bx) and torch.equal(y[s], by)


def test_a_seed_drawing_from_anothers_generator_is_caught():
    """The equivalence above fails when one seed's decisions leak into another's (here: two seeds share one
    generator, as a stacked buffer that kept a single generator would)."""
    shared = torch.Generator().manual_seed(0)
    leaky = StackedReservoir(7, "cpu", [shared, shared] + [torch.Generator().manual_seed(s) for s in (2, 3)])
    lone = [ReservoirBuffer(7, "cpu", torch.Generator().manual_seed(s)) for s in range(S)]
    fill(lone, leaky, torch.Generator().manual_seed(99))
    differs = [not torch.equal(leaky.seed_state(s)["fields"]["examples"], lone[s].fields["examples"])
               for s in range(S)]
    assert differs[:2] != [False, False] and differs[2:] == [False, False]


def test_a_stacked_mlp_refuses_what_it_cannot_stack():
    with pytest.raises(TypeError, match="stacks MLPs"):
        StackedMLP([])
    with pytest.raises(ValueError, match="input_size"):
        StackedMLP([MLP(SHAPE, CLASSES, input_size=9)])


def test_stacked_heads_compute_each_seeds_head_batchnorm_included():
    """A head of Linear, BatchNorm1d and ReLU layers (CoCa's on a ResNet): each seed's output, its BatchNorm's
    batch statistics and running estimates its own, in training and in eval mode; any other layer refused."""
    heads = []
    for seed in range(S):
        torch.manual_seed(seed)
        head = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.BatchNorm1d(5), torch.nn.ReLU(),
                                   torch.nn.Linear(5, 3)).double()
        torch.nn.init.uniform_(head[1].weight)         # not the default ones: a mix-up of seeds would show
        heads.append(head)
    stacked = stack_sequential(heads)
    for _ in range(2):
        x = torch.rand(S, B, 6, dtype=torch.float64)
        out = stacked(x)
        for s, head in enumerate(heads):
            assert close(out[s], head(x[s]))
            assert close(stacked[1].running_mean[s], head[1].running_mean)
    stacked.eval()
    for head in heads:
        head.eval()
    out = stacked(x[:, :1])                              # one sample a seed: the running estimates
    assert all(close(out[s], head(x[s, :1])) for s, head in enumerate(heads))
    with torch.no_grad():
        stacked[3].weight[1] += 1.0
        stacked[1].running_var[1] += 1.0
    unstack_sequential(stacked, 1, heads[1])
    assert close(heads[1][3].weight, stacked[3].weight[1]) and close(heads[1][1].running_var, stacked[1].running_var[1])
    assert not close(heads[0][3].weight, stacked[3].weight[0] + 1)
    with pytest.raises(TypeError, match="Dropout"):
        stack_sequential([torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Dropout()) for _ in range(S)])
