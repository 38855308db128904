"""The steps of the methods whose seeds train stacked (gcl.core.stacked): one `observe` for S seeds at once.

A stacked method is the step of its lone method (gcl.methods.<name>) with a seed dimension in front of every
batch: x (S, B, ...), y (S, B); it returns each seed's loss (S,). Its loss is the sum of the seeds' losses, each
the lone method's loss of that seed, so each seed's weights move exactly as they would alone; its buffer is a
StackedReservoir whose draws are each seed's own, in the lone method's order. On the MLP and the ResNet-18: SGD, JOINT, ER,
ER-ACE, A-GEM, DER, DER++, CoCa and CLS-ER (docs/performance.md says which methods stack and which cannot).
"""
from gcl.methods.stacked.base import StackedMethod
from gcl.methods.stacked.clser import StackedCLSER
from gcl.methods.stacked.coca import StackedCoCa
from gcl.methods.stacked.replay import (
    StackedAGEM,
    StackedDER,
    StackedDERpp,
    StackedER,
    StackedERACE,
    StackedJoint,
    StackedSGD,
)

STACKED: dict[str, type[StackedMethod]] = {
    cls.name: cls for cls in (StackedSGD, StackedJoint, StackedER, StackedERACE, StackedAGEM, StackedDER,
                              StackedDERpp, StackedCoCa, StackedCLSER)}
