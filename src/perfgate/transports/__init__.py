"""The MCP server's transports (stdio, streamable HTTP) and the JSON-RPC checks between them and the server."""
