"""The Model Context Protocol doors: `fsm-celery mcp operator` (operator.py, its tools; serve.py,
its transports), on the Python client, and `fsm-celery mcp agent` (agent.py), an SDK agent whose
tasks a coding agent takes and answers. Imports the `mcp` package, an optional extra
(`fsm-celery[mcp]`): the command line imports this package only when an MCP command runs."""
