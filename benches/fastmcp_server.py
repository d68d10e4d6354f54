"""The peer in the side-by-side benchmark: the same OpenAPI spec (openapi/sandbox-mcp.json)
served as MCP tools by FastMCP's OpenAPI support, against the same engine, over stdio.

Run by benches/bench.rs with SANDBOX_MCP_URL and SANDBOX_MCP_API_KEY set.
"""

import json
import os
import pathlib

import httpx
from fastmcp import FastMCP

spec = json.loads(
    (pathlib.Path(__file__).resolve().parent.parent / "openapi" / "sandbox-mcp.json").read_text()
)
client = httpx.AsyncClient(
    base_url=os.environ["SANDBOX_MCP_URL"],
    headers={"Authorization": "Bearer " + os.environ["SANDBOX_MCP_API_KEY"]},
    timeout=120,
)
mcp = FastMCP.from_openapi(openapi_spec=spec, client=client, name="fastmcp-openapi")

if __name__ == "__main__":
    mcp.run(show_banner=False)
