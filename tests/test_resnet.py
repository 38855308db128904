"""The small-image ResNet-18 of DER's protocol."""
import pytest
import torch
from torch import nn

from gcl.core.backbones import BACKBONES, BasicBlock, ResNet18, build_backbone


def test_registered_and_shaped_as_the_protocol_says():
    net = build_backbone("resnet18", [3, 32, 32], 10)
    assert isinstance(net, ResNet18) and BACKBONES["resnet18"] is ResNet18 and net.feat_dim == 512
    # the CIFAR ResNet-18 of DER/mammoth: 11,173,962 weights for 10 classes
    assert sum(p.numel() for p in net.parameters()) == 11_173_962
    stem = net.stem[0]
    assert (stem.kernel_size, stem.stride, stem.bias) == ((3, 3), (1, 1), None)
    assert not any(isinstance(m, nn.MaxPool2d) for m in net.modules())
    blocks = [m for m in net.modules() if isinstance(m, BasicBlock)]
    assert [b.conv1.out_channels for b in blocks] == [64, 64, 128, 128, 256, 256, 512, 512]
    assert [b.conv1.stride[0] for b in blocks] == [1, 1, 2, 1, 2, 1, 2, 1]
    assert net.classifier.in_features == 512 and net.classifier.out_features == 10


@pytest.mark.parametrize("size", [32, 64])
def test_features_and_logits_on_32_and_64_pixels(size):
    torch.manual_seed(0)
    net = ResNet18((3, size, size), 200).eval()
    x = torch.randn(2, 3, size, size)
    feats = net.features(x)
    assert feats.shape == (2, 512) and net(x).shape == (2, 200)
    assert torch.allclose(net(x), net.classifier(feats))


def test_channels_last_gives_the_same_numbers():
    torch.manual_seed(0)
    plain = ResNet18((3, 32, 32), 10)
    fast = build_backbone("resnet18", (3, 32, 32), 10, channels_last=True)
    fast.load_state_dict(plain.state_dict())
    assert fast.stem[0].weight.is_contiguous(memory_format=torch.channels_last)
    x = torch.randn(4, 3, 32, 32)
    plain.eval(), fast.eval()
    assert torch.allclose(plain(x), fast(x), atol=1e-4)


@pytest.mark.slow
def test_one_sgd_step_reduces_the_loss_on_a_fixed_batch():
    torch.manual_seed(0)
    net = ResNet18((3, 16, 16), 10)    # any size works; a small one keeps the test fast on CPU
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    x, y = torch.randn(8, 3, 16, 16), torch.arange(8) % 10
    losses = []
    for _ in range(3):
        loss = nn.functional.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_channels_last_is_refused_for_the_mlp():
    with pytest.raises(ValueError, match="channels_last applies to convolutional backbones"):
        build_backbone("mlp", (1, 28, 28), 10, channels_last=True)
