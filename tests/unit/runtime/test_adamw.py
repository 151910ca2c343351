"""The runtime's AdamW (runtime/adamw.py) is `torch.optim.AdamW`'s update to the bit, and a rank
that steps it never imports torch's compiler front end.

Compared over four steps on two groups (weight decay 0.1 on matrices, none on vectors, as
runtime/dist_opt.py `adamw` splits them), with a tensor that has no gradient at one step (its
state and step count must stay) and a state set from outside between steps (what a checkpoint
load does: runtime/optimizer_state.py `load_whole_state`).
"""

from __future__ import annotations

import subprocess
import sys

import torch

from runtime.adamw import AdamW
from tests.support.paths import ROOT

LR, BETAS, EPS, DECAY = 1e-2, (0.9, 0.95), 1e-8, 0.1


def _tensors(seed: int) -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=generator))
            for shape in ((6, 4), (3, 5), (4,), (7,))]


def test_every_step_is_torchs_adamw_to_the_bit() -> None:
    ours, theirs = _tensors(0), _tensors(0)
    mine = AdamW([(ours[:2], DECAY), (ours[2:], 0.0)], lr=LR, betas=BETAS, eps=EPS)
    torch_adamw = torch.optim.AdamW([{"params": theirs[:2], "weight_decay": DECAY},
                                     {"params": theirs[2:], "weight_decay": 0.0}],
                                    lr=LR, betas=BETAS, eps=EPS, foreach=False)
    generator = torch.Generator().manual_seed(1)
    for step in range(4):
        for a, b in zip(ours, theirs, strict=True):
            grad = torch.randn(a.shape, generator=generator)
            a.grad, b.grad = grad.clone(), grad.clone()
        if step == 1:  # the second vector has no gradient at this step
            ours[3].grad = theirs[3].grad = None
        mine.step()
        torch_adamw.step()
        if step == 2:  # a state set from outside, as a checkpoint load sets it
            for a, b in zip(ours, theirs, strict=True):
                mine.state[a] = {k: v.clone() for k, v in torch_adamw.state[b].items()}
        for a, b in zip(ours, theirs, strict=True):
            assert torch.equal(a, b)
            assert mine.state[a].keys() == torch_adamw.state[b].keys()
            for key, value in torch_adamw.state[b].items():
                assert torch.equal(mine.state[a][key], value) and \
                    mine.state[a][key].dtype == value.dtype
    assert float(mine.state[ours[3]]["step"]) == 3.0 and float(mine.state[ours[0]]["step"]) == 4.0
    mine.zero_grad()
    torch_adamw.zero_grad(set_to_none=False)
    assert all(a.grad is not None and torch.equal(a.grad, b.grad)
               for a, b in zip(ours, theirs, strict=True) if b.grad is not None)


def test_stepping_it_never_imports_the_compiler_front_end() -> None:
    """A fresh interpreter (this one may have imported it already): torch's own AdamW class would
    import torch._dynamo, and sympy with it, when it adds its first parameter group."""
    probe = ("import sys, torch\n"
             "from runtime.adamw import AdamW\n"
             "p = torch.nn.Parameter(torch.ones(3))\n"
             "opt = AdamW([([p], 0.1)], lr=1e-3, betas=(0.9, 0.95), eps=1e-8)\n"
             "p.grad = torch.ones(3)\n"
             "opt.step(); opt.zero_grad()\n"
             "print(sorted(m for m in ('torch._dynamo', 'sympy') if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
