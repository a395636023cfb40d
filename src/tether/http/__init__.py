"""The HTTP and SSE interface of docs/api.md: one module per resource, built by `create_app`."""
