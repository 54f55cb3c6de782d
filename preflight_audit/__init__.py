"""preflight-audit: the command line, its settings, the HTTP read API and the demo."""
