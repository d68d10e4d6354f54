"""Times E2B's Python SDK against the engine's E2B listener: Sandbox.create() until the first
commands.run("true") returns, `runs` times (argv[1]); kills each sandbox after, untimed. Prints
the samples in milliseconds as one JSON list. The SDK is configured by E2B_API_URL,
E2B_SANDBOX_URL and E2B_API_KEY only, as a user's program would be."""

import json
import sys
import time

from e2b import Sandbox

runs = int(sys.argv[1])
# One untimed round: the SDK's imports and first connections are not the engine's.
Sandbox.create().kill()
samples = []
for _ in range(runs):
    start = time.perf_counter()
    sbx = Sandbox.create()
    r = sbx.commands.run("true")
    samples.append((time.perf_counter() - start) * 1000)
    assert r.exit_code == 0
    sbx.kill()
print(json.dumps(samples))
