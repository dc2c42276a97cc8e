"""A GPT-style decoder split into pipeline stages, and the sizes emulated compute needs.

Virtual stage s of n holds a contiguous block of ``layers / n`` transformer blocks; stage 0 also
holds the token and position embeddings, the last stage the final norm, the LM head and the
loss. Between stages flows a ``[microbatch_size, seq_len, hidden]`` activation.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from testbed.spec import ModelSpec

# Peak dense bf16 throughput of the device profiles (vendor data sheets), FLOP/s.
PEAK_FLOPS = {"a100": 312e12, "h100": 989e12}


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


def layer_params(spec: ModelSpec) -> int:
    """Parameters of one block (attention 4h² + MLP 8h², biases and norms)."""
    h = spec.hidden
    return 12 * h * h + 13 * h


def stage_params(spec: ModelSpec, stage: int, n_stages: int) -> int:
    """Parameters held by a virtual stage (embeddings on the first, head on the last)."""
    n = layer_params(spec) * (spec.layers // n_stages)
    if stage == 0:
        n += (spec.vocab + spec.seq_len) * spec.hidden
    if stage == n_stages - 1:
        n += spec.vocab * spec.hidden + 2 * spec.hidden
    return n


def forward_flops(spec: ModelSpec, stage: int, n_stages: int, microbatch_size: int) -> float:
    """FLOPs of one stage's forward for one microbatch: 2 per parameter per token for the
    matrices, plus attention scores (2·s²·h per layer, twice)."""
    tokens = microbatch_size * spec.seq_len
    layers = spec.layers // n_stages
    flops = 2 * tokens * layer_params(spec) * layers
    flops += 4 * microbatch_size * spec.seq_len ** 2 * spec.hidden * layers
    if stage == n_stages - 1:
        flops += 2 * tokens * spec.vocab * spec.hidden
    return float(flops)


def activation_numel(spec: ModelSpec, microbatch_size: int, bytes_scale: float = 1.0) -> int:
    """Elements of the activation (and its gradient) between stages, scaled by
    ``bytes_scale`` (at least 1)."""
    return max(1, math.ceil(microbatch_size * spec.seq_len * spec.hidden * bytes_scale))
