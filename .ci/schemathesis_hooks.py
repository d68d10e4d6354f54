"""schemathesis hooks for .ci/schemathesis: what OpenAPI 3.0 cannot state.

positive_data_acceptance fails the run when a request the spec calls valid is refused. The spec
states every rule 3.0 can; RESIDUAL lists the ones it cannot, which the spec's descriptions say in
words and the engine refuses with a message that says what to give. Such a refusal is forgiven
only when all of these hold: the failure is positive_data_acceptance's, the status and
`error_code` are the rule's (400 `invalid_argument`; 413 `payload_too_large` for sizes the
sandbox's files reached), the operation is one the rule applies to, and the engine's message is
the rule's. Any other refusal of valid data fails the run.

The spec also names two string formats of its own (see NetworkRules), `cidr` and
`domain-or-cidr`; they are generated here, so that generated egress rules are what the spec means.
"""

import json
import pathlib
import re

import schemathesis
from hypothesis import strategies as st

SPEC = json.loads((pathlib.Path(__file__).parent.parent / "openapi/sandbox-mcp.json").read_text())

FILES = {
    "read_file",
    "write_file",
    "delete_file",
    "list_files",
    "move_file",
    "download_dir",
}
CREATE = {"create_sandbox", "create_computer"}
NETWORK = CREATE | {"update_sandbox", "create_template"}

# rule: (operations, the start of the engine's message as a regex[, status, when not 400])
RESIDUAL = {
    # Map keys: 3.0 has no `propertyNames`.
    "environment variable names (map keys)": (
        CREATE | {"exec_command", "exec_command_stream", "create_template", "put_server"},
        r'environment variable name ".*" is invalid',
    ),
    "metadata keys (map keys)": (
        CREATE | {"update_sandbox", "fork_sandbox"},
        r'metadata key ".*" is invalid',
    ),
    "secret binding names (map keys)": (
        CREATE | {"put_server"},
        r'".*" is not an environment variable name',
    ),
    # Lengths in bytes: 3.0's maxLength counts characters.
    "255 bytes per file name": (
        FILES | {"exec_command", "exec_command_stream", "create_code_context", "diff_sandbox"},
        r"a name in .* is too long \(the limit is 255 bytes per name\)",
    ),
    "4096 bytes per path": (FILES, r"path is \d+ bytes long; the limit is 4096"),
    "8 KiB secret value": (
        {"set_secret"},
        r"the value is \d+ bytes; at most 8192",
    ),
    # Relations between fields.
    "steps or from_sandbox": (
        {"create_template"},
        r"give steps \(e\.g\.|give either steps or from_sandbox",
    ),
    "50 build steps, one per variable of an env step": (
        {"create_template"},
        r"a build has at most 50 steps",
    ),
    "256 egress rules in allow_out and deny_out together": (
        NETWORK,
        r"\d+ network rules given; at most 256",
    ),
    # What a header name must be to carry a secret (a list of names, not a pattern).
    "headers servers echo back or route by": (
        {"set_secret"},
        r"\S+ cannot carry a secret: servers echo it back or route requests by it",
    ),
    "base64 content when encoding is base64": (
        {"write_file"},
        r"content is not valid base64",
    ),
    "what each computer action needs": (
        {"computer_action"},
        r"action \w+ needs |.* needs both coordinates",
    ),
    "a move into itself": ({"move_file"}, r"cannot move .* into itself"),
    # An item's rule by its place: 3.0 has no `prefixItems`.
    "the program to run (command[0]) is not empty": (
        {"put_server"},
        r"command is empty \(or command\[0\] is\)",
    ),
    # A WebSocket's handshake is headers no schema describes (x-dropshot-websocket).
    "a WebSocket handshake": (
        {"attach_process"},
        r"this operation is a WebSocket: send a GET with",
    ),
    "a merge with itself": (
        {"merge_sandbox"},
        r"source_id and target_id are the same sandbox",
    ),
    "a path that resolves to /": (
        {"delete_file", "write_file"},
        r"refusing to delete / |cannot write to /$",
    ),
    # What the sandbox, the engine or its host hold.
    "a path whose kind or parents do not fit": (
        FILES | {"exec_command", "exec_command_stream", "create_code_context", "diff_sandbox"},
        r".* is a directory; list it with|.* is not a directory; read"
        r"|a parent of .* is not a directory"
        r"|too many levels of symbolic links|.* is not a regular file"
        r"|cwd (does not exist|is not a directory)",
    ),
    # Mount points relative to each other and to the sandbox's own tree.
    "a mount point a sandbox can have": (
        {"create_sandbox"},
        r'volume path ".*": |mount points \S+ and \S+ overlap|\S+ is listed twice in volumes',
    ),
    "a volume quota where the engine can keep one (its btrfs store)": (
        {"create_volume"},
        r"this engine cannot enforce volume quotas",
    ),
    "a secret that exists": (
        CREATE | {"attach_secret"},
        r"secret \S+ does not exist",
    ),
    "a shape within the template's": (
        CREATE,
        r"shape\.\w+ \S+ is more than template",
    ),
    "a desktop template (Xvfb on the host)": (
        {"create_computer"},
        r"there is no `desktop` template",
    ),
    "a point on the screen": ({"computer_action"}, r".* is off the \d+x\d+ screen"),
    "keys: combinations of key names the desktop knows": (
        {"computer_action"},
        r'unknown key|".*" has an empty key|in ".*", ".*" is not a modifier'
        r"|keys is empty|keys has \d+ combinations",
    ),
    "32 labels on a fork, the parent's included": (
        {"fork_sandbox"},
        r"the children would have \d+ metadata labels",
    ),
    "an image archive": ({"import_template"}, r"cannot import the image"),
    # 413, not 400: what the sandbox's files have grown to.
    "a file or directory too large to send": (
        {"read_file", "download_dir"},
        r"the zip of .* exceeds \d+ bytes|.* is \d+ bytes; files_read returns at most",
        413,
    ),
}

CODES = {400: "invalid_argument", 413: "payload_too_large"}
_RULES = [(rule[0], re.compile(rule[1]), (rule[2:] or (400,))[0]) for rule in RESIDUAL.values()]


def residual(operation_id, status, body):
    """Whether a refusal is one of the rules above."""
    if not isinstance(body, dict) or body.get("error_code") != CODES.get(status):
        return False
    message = body.get("message", "")
    return any(
        operation_id in ops and status == code and rx.match(message) for ops, rx, code in _RULES
    )


@schemathesis.hook
def filter_failure(context, failure, case, response):
    if getattr(failure, "code", None) != "ST202":  # positive_data_acceptance
        return True
    operation_id = case.operation.definition.raw.get("operationId")
    try:
        body = response.json()
    except ValueError:
        return True
    return not residual(operation_id, response.status_code, body)


def _cidr(ip):
    return st.one_of(
        st.just(str(ip)),
        st.integers(0, ip.max_prefixlen).map(lambda prefix: f"{ip}/{prefix}"),
    )


CIDR = st.ip_addresses().flatmap(_cidr)
# The spec's own pattern for a domain pattern (a secret's hosts), whole-string.
_HOSTS = SPEC["components"]["schemas"]["SetSecretRequest"]["properties"]["hosts"]["items"]
DOMAIN = st.from_regex(_HOSTS["pattern"].removesuffix("$") + r"\Z").filter(
    lambda name: len(name.lstrip("*.").rstrip(".")) <= 253
)

schemathesis.openapi.format("cidr", CIDR)
schemathesis.openapi.format("domain-or-cidr", st.one_of(CIDR, DOMAIN))
