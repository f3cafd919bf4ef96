"""The peer for the start-up benchmark: the smallest useful MCP server on the same SDK, one tool."""

from mcp.server import MCPServer
from pydantic import BaseModel

server = MCPServer("minimal")


class Ratio(BaseModel):
    utilization: float


@server.tool()
def ratio(flops: float, seconds: float, peak_tflops: float) -> Ratio:
    """Achieved / peak."""
    return Ratio(utilization=flops / seconds / 1e12 / peak_tflops)


if __name__ == "__main__":
    server.run("stdio")
