"""Named class orders for sequential benchmarks (`class_order: <name>`): the source's class indices in the
order in which tasks take them; task t holds the t-th consecutive group of `classes_per_task` of them.

cifar100-superclass: CIFAR-100's 100 classes grouped by their 20 superclasses (5 fine classes each), in the
order of CN-DPM's Split-CIFAR100 episode (Lee et al., ICLR 2020; file episodes/cifar100-split-online.yaml of
github.com/soochan-lee/CN-DPM): superclasses in CIFAR-100's coarse-label order, fine classes ascending
within each. Indices are CIFAR-100's fine labels (torchvision's `classes` order, alphabetical).
"""
from __future__ import annotations

CIFAR100_SUPERCLASS = (
    4, 30, 55, 72, 95,      # aquatic mammals
    1, 32, 67, 73, 91,      # fish
    54, 62, 70, 82, 92,     # flowers
    9, 10, 16, 28, 61,      # food containers
    0, 51, 53, 57, 83,      # fruit and vegetables
    22, 39, 40, 86, 87,     # household electrical devices
    5, 20, 25, 84, 94,      # household furniture
    6, 7, 14, 18, 24,       # insects
    3, 42, 43, 88, 97,      # large carnivores
    12, 17, 37, 68, 76,     # large man-made outdoor things
    23, 33, 49, 60, 71,     # large natural outdoor scenes
    15, 19, 21, 31, 38,     # large omnivores and herbivores
    34, 63, 64, 66, 75,     # medium-sized mammals
    26, 45, 77, 79, 99,     # non-insect invertebrates
    2, 11, 35, 46, 98,      # people
    27, 29, 44, 78, 93,     # reptiles
    36, 50, 65, 74, 80,     # small mammals
    47, 52, 56, 59, 96,     # trees
    8, 13, 48, 58, 90,      # vehicles 1
    41, 69, 81, 85, 89,     # vehicles 2
)

CLASS_ORDERS: dict[str, tuple[int, ...]] = {
    "cifar100-superclass": CIFAR100_SUPERCLASS,
}
