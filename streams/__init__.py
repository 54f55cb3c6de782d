"""The stream processor: a Faust worker that folds every preflight event into per-`action_key` state.

`streams.app` builds the Faust app (`create_app(settings)`; `faust -A streams.app worker` uses the
module-level `app`, configured from `PREFLIGHT_*` environment variables). The decisions live in pure
code: `preflight.fold.evolve` folds one message into a key's state and `streams.batch` folds a batch of
one partition, keeps the partition's watermark and names every anomaly for the dead-letter topic. The
worker serves each key's executed-only baseline over HTTP (`GET /baseline/{action_key}`), which
`preflight.adapters.baseline.BaselineStorage` reads for tier 4.

`streams.process` starts and stops such a worker as a subprocess (tests, benchmarks, the demo).
"""
