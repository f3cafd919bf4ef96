"""The error an agent can act on.

`ToolError` is re-exported from the MCP SDK so library code outside `tools/` can raise it without
knowing the protocol: the server turns it into an ``is_error`` result carrying the message verbatim.
The harness never imports this module (it runs inside the user's training process).
"""

from mcp.server.mcpserver.exceptions import ToolError

__all__ = ["ToolError"]
