"""What ``fabricscope probe --matrix`` draws and writes.

- ``matrix``   every (local GPU, remote GPU) pair in rounds of disjoint pairs; CSV and PNG.
- ``heatmap``  the GPU-pair bandwidth heatmap (matplotlib, imported only when drawing).

Only the CLI uses it: the resident agent never imports matplotlib.

May import: nothing of the agent (pure apart from matplotlib).
"""
