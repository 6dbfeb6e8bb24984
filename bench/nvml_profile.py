"""Profiles steady NVML passes (after the first) on a GPU node: where the CPU goes.

python bench/nvml_profile.py [passes]
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent.nvml.sampler import NvmlSampler

passes = int(sys.argv[1]) if len(sys.argv) > 1 else 36
sampler = NvmlSampler(watch_xid=False)
sampler.sample()
prof = cProfile.Profile()
t0 = time.process_time()
prof.enable()
for _ in range(passes):
    sampler.sample()
prof.disable()
print(f"CPU per steady pass: {(time.process_time() - t0) / passes * 1000:.2f} ms (profiled)")
pstats.Stats(prof).sort_stats("tottime").print_stats(14)
sampler.close()
