"""`pflkit.fl.train.sgd_step` is `torch.optim.SGD`'s step: the same float operations, bitwise."""
from __future__ import annotations

import pytest
import torch

from pflkit.fl.train import sgd_step


@pytest.mark.parametrize("momentum, weight_decay", [(0.0, 0.0), (0.9, 0.0), (0.0, 1e-2), (0.5, 1e-3)])
def test_sgd_step_is_torch_sgd_bitwise(momentum, weight_decay):
    g = torch.Generator().manual_seed(0)
    shapes = [(3, 4), (5,), (2, 2, 3)]
    ours = [torch.randn(s, generator=g) for s in shapes]
    theirs = [torch.nn.Parameter(t.clone()) for t in ours]
    opt = torch.optim.SGD(theirs, lr=0.05, momentum=momentum, weight_decay=weight_decay)
    buffers = [None] * len(ours)
    for step in range(4):
        grads = [torch.randn(s, generator=g) for s in shapes]
        grads[1] = None if step == 1 else grads[1]  # a parameter without a gradient is skipped, as SGD does
        for p, gr in zip(theirs, grads):
            p.grad = gr
        opt.step()
        buffers = sgd_step(ours, grads, buffers, lr=0.05, momentum=momentum, weight_decay=weight_decay)
        for a, b in zip(ours, theirs):
            assert torch.equal(a, b.detach()), step
    if momentum:
        assert all(torch.equal(buf, opt.state[p]["momentum_buffer"]) for buf, p in zip(buffers, theirs))
