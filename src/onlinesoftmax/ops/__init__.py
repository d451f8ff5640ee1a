"""PyTorch-facing ops: argument checks, backend choice, custom-op registration, autograd."""
