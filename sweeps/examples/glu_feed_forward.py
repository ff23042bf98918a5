"""A part of one's own for the model's feed-forward slot: the gated GELU unit of Shazeer (2020),
FFN_GEGLU(x) = (GELU(x W) * x V) W2, registered as ``geglu``. A spec names this file in
``model.modules`` and the part in ``model.feed_forward`` (``sweeps/examples/glu.yaml``).

At the same d_ff it has 1.5x the relu FFN's parameters and multiply-adds (W and V are each
d_model x d_ff); Shazeer shrinks d_ff by 2/3 to compare at equal cost."""

import torch.nn.functional as F
from torch import nn

from reproduce.paper.slots import register


class GegluFeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.w_1 = nn.Linear(d_model, 2 * d_ff)  # W and V side by side: one matmul
        self.w_2 = nn.Linear(d_ff, d_model)

    def forward(self, x):
        gate, value = self.w_1(x).chunk(2, dim=-1)
        return self.w_2(F.gelu(gate) * value)


@register("feed_forward", "geglu")
def geglu(config):
    return GegluFeedForward(config.d_model, config.d_ff)
