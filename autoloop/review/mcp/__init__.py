"""`autoloop mcp`: the night for a coding agent over the Model Context Protocol (the MCP SDK
is an optional extra: ``pip install 'autoloop[mcp]'``). The read tools' answers (tools.py),
the write tools' checks (steering.py), the server that wires both to the protocol
(server.py), and each client's configuration that ``--install`` writes (client_setup.py).
"""
