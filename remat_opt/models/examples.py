"""Small models used by the tests, the docs and `remat-opt inspect examples:block`."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    """A pre-norm transformer block: LayerNorm, fused qkv, causal SDPA, projection, GELU MLP."""

    def __init__(self, n_embd: int = 64, n_head: int = 4, mlp_ratio: int = 4):
        super().__init__()
        self.n_head = n_head
        self.norm_1 = nn.LayerNorm(n_embd)
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)
        self.norm_2 = nn.LayerNorm(n_embd)
        self.fc = nn.Linear(n_embd, mlp_ratio * n_embd)
        self.fc_out = nn.Linear(mlp_ratio * n_embd, n_embd)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, n_embd = x.shape
        q, k, v = self.qkv(x).split(n_embd, dim=-1)
        heads = (batch, seq, self.n_head, n_embd // self.n_head)
        q, k, v = (t.view(heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(batch, seq, n_embd))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm_1(x))
        return x + self.fc_out(F.gelu(self.fc(self.norm_2(x))))


def block(batch: int = 2, seq: int = 32, n_embd: int = 64, n_head: int = 4, device: str = "cpu"):
    """Factory for `remat-opt inspect remat_opt.models.examples:block`: returns (model, example inputs)."""
    torch.manual_seed(0)
    model = Block(n_embd, n_head).to(device)
    x = torch.randn(batch, seq, n_embd, device=device, requires_grad=True)
    return model, (x,)
