"""preflight-audit: the command line, its settings, the HTTP read API and the demo.

`preflight_audit.cli` is the `preflight-audit` command; `settings` its configuration; `api` the FastAPI
read API over the projections; `demo` and `scenarios` the one-command demo and the agent sessions it
plays (reusable by benchmarks and tests); `services`, `serve`, `export` and `report` the pieces behind
the commands.
"""
