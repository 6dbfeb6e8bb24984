"""fabricscope agent: samplers, runner and analysis. Knows nothing about Prometheus."""

__version__ = "0.1.0"
