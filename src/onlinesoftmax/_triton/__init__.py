"""Shared Triton machinery: the online-softmax building blocks (``online``) and launches, workspace and the one
cache (``launch``, ``host``). Imports nothing from the op families; ``host`` imports no Triton."""
