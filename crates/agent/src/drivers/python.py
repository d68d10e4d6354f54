# The persistent Python interpreter behind sandbox_run_code. Started by the agent with requests on
# fd 3 and responses on fd 4 (one JSON object per line); the cell's own output goes to the real
# stdout and stderr, which the agent captures. Variables, imports and open files persist in `ns`.
import ast, asyncio, inspect, json, linecache, os, sys, traceback

ctl_in = os.fdopen(3, "rb", buffering=0)
ctl_out = os.fdopen(4, "wb", buffering=0)
ns = {"__name__": "__main__", "__builtins__": __builtins__}
FLAGS = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
loop = asyncio.new_event_loop()


def run(code_obj):
    value = eval(code_obj, ns)
    if code_obj.co_flags & inspect.CO_COROUTINE:
        value = loop.run_until_complete(value)
    return value


cells = 0


def execute(code):
    global cells
    cells += 1
    # Each cell gets its own name, registered with linecache so tracebacks show its source lines.
    name = f"<cell {cells}>"
    linecache.cache[name] = (len(code), None, code.splitlines(True), name)
    tree = ast.parse(code, name, "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    run(compile(tree, name, "exec", flags=FLAGS))
    if last is None:
        return None
    value = run(compile(last, name, "eval", flags=FLAGS))
    if value is None:
        return None
    ns["_"] = value
    text = repr(value)
    return text if len(text) <= 65536 else text[:65536] + "…"


while True:
    line = ctl_in.readline()
    if not line:
        break
    request = json.loads(line)
    try:
        response = {"ok": True, "result": execute(request["code"])}
    except BaseException as e:  # SystemExit and KeyboardInterrupt included: the session survives
        tb = traceback.format_exception(type(e), e, e.__traceback__)
        # Drop the driver's own frames: the model only needs its cell's.
        tb = [t for t in tb if 'File "<string>"' not in t]
        response = {"ok": False, "error": {"name": type(e).__name__, "message": str(e), "traceback": "".join(tb)}}
    sys.stdout.flush()
    sys.stderr.flush()
    ctl_out.write(json.dumps(response).encode() + b"\n")
