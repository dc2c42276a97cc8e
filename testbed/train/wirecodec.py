"""How a real outer all-reduce (``gradient_sync.outer_dtype``, ``testbed.train.outer``) puts a
chunk of float32 values on the wire: as they are (fp32), rounded to bfloat16 (bf16), or
quantized to 8 or 4 bits with one float32 scale per chunk (int8, int4), as INTELLECT-1's int8
all-reduce and Streaming DiLoCo's 4-bit outer gradients do.

Every message is bytes (``torch.uint8``): a chunk's values in the type, then, for int8 and
int4, its scale. Quantization is symmetric: the scale is the chunk's largest magnitude over
127 (int8) or 7 (int4), a value is rounded to the nearest step and decoded as step × scale;
int4 keeps two values per byte (the low nibble first), each offset by 8.
The receiver adds in float32 what it decodes (a reduce step) or keeps it (a gather step), so
sums are never held in the narrow type; ``testbed.train.ring`` forwards a gathered chunk's
message as received, so every replica decodes the same bytes and ends with the same values.
"""
from __future__ import annotations

import math

import torch

_SCALE_BYTES = 4
_LEVELS = {"int8": 127, "int4": 7}
_BYTES_PER_VALUE = {"fp32": 4.0, "bf16": 2.0, "int8": 1.0, "int4": 0.5}


class WireCodec:
    """Encodes and decodes chunks in one ``outer_dtype``."""

    def __init__(self, dtype: str):
        if dtype not in _BYTES_PER_VALUE:
            raise ValueError(f"unknown outer_dtype {dtype!r}")
        self.dtype = dtype

    def nbytes(self, numel: int) -> int:
        """Bytes of the message that carries ``numel`` values."""
        scale = _SCALE_BYTES if self.dtype in _LEVELS else 0
        return math.ceil(numel * _BYTES_PER_VALUE[self.dtype]) + scale

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """The message (uint8) that carries the float32 values ``x``."""
        x = x.detach().float().contiguous()
        if self.dtype == "fp32":
            return x.view(torch.uint8).clone()
        if self.dtype == "bf16":
            return x.to(torch.bfloat16).view(torch.uint8).clone()
        levels = _LEVELS[self.dtype]
        top = float(x.abs().max()) if x.numel() else 0.0
        scale = torch.tensor([top / levels if top > 0 else 1.0], dtype=torch.float32,
                             device=x.device)
        q = torch.round(x / scale).clamp_(-levels, levels)
        if self.dtype == "int8":
            values = q.to(torch.int8).view(torch.uint8)
        else:
            nib = (q + 8).to(torch.uint8)
            if nib.numel() % 2:
                nib = torch.cat([nib, torch.full((1,), 8, dtype=torch.uint8, device=x.device)])
            values = nib[0::2] | (nib[1::2] << 4)
        return torch.cat([values, scale.view(torch.uint8)])

    def decode(self, msg: torch.Tensor, numel: int) -> torch.Tensor:
        """The ``numel`` float32 values message ``msg`` carries."""
        if self.dtype == "fp32":
            return msg.view(torch.float32)[:numel].clone()
        if self.dtype == "bf16":
            return msg.view(torch.bfloat16)[:numel].float()
        scale = msg[-_SCALE_BYTES:].clone().view(torch.float32)
        values = msg[:-_SCALE_BYTES]
        if self.dtype == "int8":
            q = values.view(torch.int8).float()
        else:
            q = torch.stack([values & 0xF, values >> 4], dim=1).flatten()[:numel].float() - 8
        return q * scale
