"""Smaller models from bigger ones: pruning by measured importance (depth and width, Minitron),
unstructured and 2:4 magnitude sparsity, and the prune -> heal -> evaluate recipe."""
