"""The HTTP and SSE interface of API.md: one module per resource, built by `create_app`."""
