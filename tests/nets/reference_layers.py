"""Layers written out from raw weights, for the nets tests' references (no module's forward is trusted)."""
import torch


def linear(x, layer):
    """x W^T + b of an nn.Linear."""
    return x @ layer.weight.T + layer.bias


def norm(x, layer):
    """LayerNorm written out: (x - mean) / sqrt(var + eps) * gamma + beta (biased variance)."""
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + layer.eps) * layer.weight + layer.bias
