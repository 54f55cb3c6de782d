"""The `preflight-audit` command (placeholder until the CLI lands)."""


def main() -> None:
    raise SystemExit("preflight-audit: not built yet")
