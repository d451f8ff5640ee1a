"""Attention kernels: ``fwd`` (the (m, d, o) forward) and ``bwd`` (Δ, dK/dV, dQ). Importing them imports Triton."""
