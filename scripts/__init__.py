"""Developer scripts: dev stack, benchmarks, local stand-ins (a package so tests import them)."""
