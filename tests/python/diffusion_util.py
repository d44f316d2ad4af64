"""Helpers of the image pipeline tests: seeded perturbation of a diffusers
model's rank <= 1 parameters (norms start at 1 and biases at 0, where a
test could not see them) and the relative error the issue bounds."""
import torch

from oracle import to_torch


def perturb(model, seed=0):
    """Adds a seeded N(0, 0.1) to every parameter of rank <= 1."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() <= 1:
                p.add_(torch.randn(p.shape, generator=g) * 0.1)
    return model


def rel_err(got, want):
    """max |hubrt - reference| / max |reference|."""
    g, w = to_torch(got).double(), want.double()
    assert tuple(g.shape) == tuple(w.shape), f"shape {tuple(g.shape)} != {tuple(w.shape)}"
    return ((g - w).abs().max() / w.abs().max()).item()
