"""A GPT-style decoder split into pipeline stages (its sizes: ``testbed.spec.workload``).

Virtual stage s of n holds a contiguous block of ``layers / n`` transformer blocks; stage 0 also
holds the token and position embeddings, the last stage the final norm, the LM head and the
loss. Between stages flows a ``[microbatch_size, seq_len, hidden]`` activation.
"""
from __future__ import annotations

import torch
from torch import nn

from testbed.spec.workload import ModelSpec


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention and a 4× MLP."""

    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.attn = nn.MultiheadAttention(hidden, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(),
                                 nn.Linear(4 * hidden, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seq = x.shape[1]
        mask = torch.triu(torch.ones(seq, seq, dtype=torch.bool, device=x.device), diagonal=1)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class Stage(nn.Module):
    """One virtual pipeline stage: optional embedding, blocks, optional head."""

    def __init__(self, spec: ModelSpec, stage: int, n_stages: int):
        super().__init__()
        per = spec.layers // n_stages
        self.first, self.last = stage == 0, stage == n_stages - 1
        if self.first:
            self.tok = nn.Embedding(spec.vocab, spec.hidden)
            self.pos = nn.Embedding(spec.seq_len, spec.hidden)
        self.blocks = nn.ModuleList(Block(spec.hidden, spec.heads) for _ in range(per))
        if self.last:
            self.norm = nn.LayerNorm(spec.hidden)
            self.head = nn.Linear(spec.hidden, spec.vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            positions = torch.arange(x.shape[1], device=x.device)
            x = self.tok(x) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        if self.last:
            x = self.head(self.norm(x))
        return x


def build_stage(spec: ModelSpec, stage: int, n_stages: int, seed: int) -> Stage:
    """Stage ``stage`` with weights that depend only on (seed, stage): re-runs are identical."""
    torch.manual_seed(seed * 1000 + stage)
    return Stage(spec, stage, n_stages)

