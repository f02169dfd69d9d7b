"""`make bench`: gpuq measured against the physical limit and against its peers, in one run.

Entry point: `python -m bench.run` (see bench/README.md). Not part of `make test`: speed
targets live here, never in timed unit tests."""
