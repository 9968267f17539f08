"""Schemathesis hooks for scripts/schemathesis.sh (loaded through SCHEMATHESIS_HOOKS).

What they adapt, and why, is described at the top of scripts/schemathesis.sh.
"""
import re
import uuid

import schemathesis

# schemathesis 4.32 aborts the whole run when a 2xx body holds a string that starts with
# http:// but is not a valid URL (e.g. an echoed webhook url "http://[x"): it only scans
# bodies for links, so such a string is simply not one.
try:
    from schemathesis.engine import observations as _observations

    _same_origin_path = _observations._same_origin_path
except (ImportError, AttributeError):  # another schemathesis version: nothing to patch
    _observations = None

if _observations is not None:
    def _safe_same_origin_path(value, origin):
        try:
            return _same_origin_path(value, origin)
        except ValueError:
            return None

    _observations._same_origin_path = _safe_same_origin_path

LONG_POLLS = {
    ("GET", "/v1/queues/{name}/wait"): ("timeout", 3600.0, 30),
    ("GET", "/v1/operations/{id}/wait"): ("timeout", 3600.0, 30),
    ("GET", "/v1/events"): ("wait", 300.0, None),
    ("POST", "/v1/queues/{name}/claim"): ("wait", 300.0, None),
}
CREATES = {"/v1/queues", "/v1/queues/{name}/operations", "/v1/queues/{name}/barrier"}
BYTE_LIMIT = re.compile(r"must be at most [0-9]+ bytes|\(1 to [0-9]+ bytes\)")
COMMAND_PATH_FIELD = re.compile(r'"detail":"spec\.(argv\[0\]|cwd): must be an absolute path')
# The same refusals for an element of a batch, and the batch's own that JSON Schema cannot
# express: a ref must be unique and may name only an earlier element.
BATCH = "/v1/operations:batch"
BATCH_DOCUMENTED = re.compile(
    r'"detail":"operations\[[0-9]+\]\.(spec\.(argv\[0\]|cwd): must be an absolute path'
    r"|dependencies\[[0-9]+\]: 'ref:.*' names no earlier element of the batch"
    r"|ref: '.*' is already the ref of operations)")
# The same for an operation of an archive restore, and the archive's own: its ids are unique,
# a dependency names an operation of the archive (not itself) or an operation id, and the
# archive's dependencies close no cycle.
ARCHIVE = "/v1/queues/{name}/archive"
ARCHIVE_DOCUMENTED = re.compile(
    r'"detail":"operations\[[0-9]+\]\.(spec\.(argv\[0\]|cwd): must be an absolute path'
    r"|id: '.*' is already the id of operations"
    r"|dependencies\[[0-9]+\]: ('.*' is neither the id of an operation in the archive nor an operation id"
    r"|names no other operation of the archive)"
    r"|dependencies: close a cycle among the archive's operations)")
# `limits` of a create, a batch's element, an archive's operation or a copy: a limiter that
# does not exist is 422 naming `limits[i].limiter` (it depends on the server's state, like a
# dependency that does not exist), and so is one limiter and key named twice when one of the two
# leaves `key` out (it means "", which `uniqueItems` cannot see).
LIMITS_PATHS = {"/v1/queues/{name}/operations", BATCH, ARCHIVE, "/v1/operations/{id}/copy"}
LIMITS_DOCUMENTED = re.compile(
    r'"detail":"(operations\[[0-9]+\]\.)?limits\[[0-9]+\](\.limiter: no limiter named '
    r"|: names limiter '.*' with key '.*' a second time)")
# A limiter's PATCH that would leave it neither `concurrency` nor `rate`: the body alone cannot
# say (the schema refuses only both set to null), the limiter's settings do.
SCHEDULE_DOCUMENTED = re.compile(
    r'"detail":"(cron: |timezone: |endAt: must be after startAt|to: (must be after from|\[from, to\) holds)'
    r"|operation\.(spec|limits|fairnessKey|kind|queuePriority|retry|name|timeout|admission\.debounce\.maxSeconds: must be a number of seconds from seconds)"
    r"|name: must match"
    # The template's limits, refused as a create's are.
    r"|operation\.limits\[[0-9]+\](\.limiter: no limiter named |: names limiter '.*' with key '.*' a second time))")
ADMISSION_MAX_BELOW_SECONDS = re.compile(
    r'"detail":"(operations\[[0-9]+\]\.)?admission\.debounce\.maxSeconds: must be a number of seconds from seconds')
LIMITER_NEEDS_A_BUDGET = '"detail":"concurrency: a limiter needs at least one of concurrency and rate"'


@schemathesis.hook
def before_call(context, case, kwargs):
    method, path = case.method.upper(), case.operation.path
    # Schemathesis reuses its few generated Idempotency-Keys across unrelated requests; a
    # replay then returns the first answer (as it should), e.g. a 201 for a queue deleted
    # since, which its stateful checks read as "created resource not found". A fresh key per
    # request keeps the header exercised; replays are tested in Tests/APITests.
    if case.headers and any(k.lower() == "idempotency-key" for k in case.headers):
        case.headers = {k: v for k, v in case.headers.items() if k.lower() != "idempotency-key"}
        case.headers["Idempotency-Key"] = uuid.uuid4().hex
    rule = LONG_POLLS.get((method, path))
    if rule is not None:
        if case.query is None:
            case.query = {}
        name, maximum, default = rule
        # An absent `timeout` of the wait route means 30 s.
        value = case.query.get(name, default)
        if not isinstance(value, bool):
            try:
                seconds = float(value)
            except (TypeError, ValueError):
                seconds = None
            if seconds is not None and 1.0 < seconds <= maximum:
                case.query[name] = 1


@schemathesis.hook
def filter_failure(context, failure, case, response):
    """Drop only reports for refusals the contract documents."""
    # A create naming dependencies that do not exist is 404 (API.md: unknown operation); the
    # stateful phase reads any 404 after creating a queue as "created resource not found".
    if (response is not None and response.status_code == 404 and case.method.upper() == "POST"
            and case.operation.path == "/v1/queues/{name}/operations"
            and "no operation with id" in (response.text or "")):
        return False
    if (response is not None and response.status_code == 404 and case.method.upper() == "POST"
            and case.operation.path == BATCH
            and ("no operation with id" in (response.text or "") or "no queue named" in (response.text or ""))):
        return False
    if type(failure).__name__ != "RejectedPositiveData" or response.status_code != 422:
        return True
    # The one date refusal NotBefore's pattern cannot express (openapi.yaml says so): a time
    # written on 1970-01-01 or 2261-12-31 whose offset takes it out of those years in UTC.
    if "its offset takes it outside the years 1970 to 2261 in UTC" in (response.text or ""):
        return False
    text = response.text or ""
    if (case.method.upper() == "PATCH" and case.operation.path == "/v1/limiters/{name}"
            and LIMITER_NEEDS_A_BUDGET in text):
        return False
    # A schedule's cron (its grammar, and a day no chosen month has), its time zone (the server's
    # tz database), its template (checked like a create: the same refusals) and endAt after
    # startAt: what JSON Schema cannot say.
    if (case.operation.path.startswith("/v1/queues/{name}/schedules") and case.method.upper() in ("POST", "PATCH")
            and SCHEDULE_DOCUMENTED.search(text)):
        return False
    # A host's hand setting that ends in the past: the schema cannot say "a future time".
    if (case.method.upper() == "PATCH" and case.operation.path == "/v1/hosts/{host}"
            and '"detail":"until: must be in the future"' in text):
        return False
    if case.method.upper() != "POST":
        return True
    if case.operation.path in LIMITS_PATHS and LIMITS_DOCUMENTED.search(text):
        return False
    # A debounce's `maxSeconds` below its `seconds` (the schema cannot compare two members).
    if case.operation.path in (BATCH, "/v1/queues/{name}/operations") and ADMISSION_MAX_BELOW_SECONDS.search(text):
        return False
    body = case.body if isinstance(case.body, dict) else {}
    # Length limits are in UTF-8 bytes; JSON Schema's maxLength counts characters.
    if BYTE_LIMIT.search(text):
        return False
    # `completed` may not exceed a positive `total` (not expressible in JSON Schema).
    if case.operation.path == "/v1/operations/{id}/progress" and "completed: must not exceed total" in text:
        return False
    if case.operation.path == BATCH:
        return not (BATCH_DOCUMENTED.search(text)
                    or "is not allowed on this server" in text or "is not an existing directory" in text
                    or "Idempotency-Key: was already used with a different request body" in text)
    if case.operation.path == ARCHIVE:
        return not (ARCHIVE_DOCUMENTED.search(text)
                    or "is not allowed on this server" in text or "is not an existing directory" in text
                    or "Idempotency-Key: was already used with a different request body" in text)
    if case.operation.path not in CREATES:
        return True
    # Kind command runs only executables the server allows (none unless configured), in an
    # existing directory. The server checks the spec's shape before the allow list, so on a
    # server that allows none, a refusal naming argv[0] or cwd is the documented one too.
    if body.get("kind") == "command" and ("is not allowed on this server" in text
                                          or "is not an existing directory" in text
                                          or COMMAND_PATH_FIELD.search(text)):
        return False
    # An Idempotency-Key reused with a different body (schemathesis reuses short keys).
    if "Idempotency-Key: was already used with a different request body" in text:
        return False
    return True
