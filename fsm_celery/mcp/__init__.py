"""The Model Context Protocol doors: `fsm-celery mcp operator` (operator.py, its tools; serve.py,
its transports), on the Python client. Imports the `mcp` package, an optional extra
(`fsm-celery[mcp]`): the command line imports this package only when an MCP command runs."""
