"""The compliance console: server-rendered pages on the API's app, at ``/console/``.

A reviewer signs in with the same bearer token the API takes and, in their role's view (compliance
reads values, an analyst tokens, an erased subject reads "erased"): searches runs by action key, user,
agent, tool, decision and time; reads an action's story (its runs' timeline, each run's fields and
where each value came from, the gate that stopped it); the responsibility of one decision; the gap
trends per tool, agent and day as SVG with their numbers; and integrity (verify, the digest chain,
dead letters, findings); downloads any table as CSV and a time range as Parquet.

No front-end build step: Jinja2 templates, one stylesheet and a few lines of script for the timeline's
keyboard navigation, all served from this package (`routes.install` mounts them).
"""

from preflight_audit.console.routes import COOKIE, PAGE_SIZE, install, too_many_page

__all__ = ["COOKIE", "PAGE_SIZE", "install", "too_many_page"]
