"""``fabricscope explain``: a Prometheus client that ranks the causes of a job\x27s slowdown."""
