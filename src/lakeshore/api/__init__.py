"""The HTTP API (FastAPI): routes, authentication, error mapping."""
