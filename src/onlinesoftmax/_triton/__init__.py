"""Shared Triton machinery: the online-softmax building blocks (``online``) and launches, workspace and the one
cache (``launch``). Imports nothing from the op families; importing it imports Triton."""
