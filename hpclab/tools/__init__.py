"""Command-line tools: `hpclab doctor | run | sweep | report | runs`."""
