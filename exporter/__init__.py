"""fabricscope exporter: the metric catalog, rendering and the HTTP server."""
