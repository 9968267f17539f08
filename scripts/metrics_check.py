#!/usr/bin/env python3
"""The check behind scripts/metrics-check.sh: a live opqd scraped by a real Prometheus.

Usage: metrics_check.py OPQD_URL PROMETHEUS_URL

1. Runs a few operations on opqd through its API.
2. Parses GET /metrics strictly with prometheus_client's text parser (any error fails) and
   checks that every family opqd promises is there with its type and a HELP text, and that
   every histogram is cumulative with +Inf equal to _count.
3. Asks Prometheus's HTTP API until the scraped series show the operations (bounded wait),
   and that the target is up with no scrape error.
Exits non-zero with a message naming what was wrong.
"""
import json
import re
import sys
import time
import urllib.parse
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

# Family name as prometheus_client reports it (a counter's without `_total`) -> type.
PROMISED = {
    "opqd_operations": "gauge",
    "opqd_operations_created": "counter",
    "opqd_transitions": "counter",
    "opqd_operation_retries": "counter",
    "opqd_operation_queue_wait_seconds": "histogram",
    "opqd_operation_duration_seconds": "histogram",
    "opqd_events": "counter",
    "opqd_event_sequence": "gauge",
    "opqd_sse_streams": "gauge",
    "opqd_http_requests": "counter",
    "opqd_http_request_duration_seconds": "histogram",
    "opqd_http_open_connections": "gauge",
    "opqd_http_requests_in_flight": "gauge",
    "opqd_webhook_observers": "gauge",
    "opqd_webhook_deliveries": "counter",
    "opqd_webhook_delivery_failures": "counter",
    "opqd_webhook_events_dropped": "counter",
    "opqd_webhook_events_pending": "gauge",
    "opqd_store_commits": "counter",
    "opqd_store_records": "counter",
    "opqd_store_largest_commit": "gauge",
    "opqd_store_failures": "counter",
    "opqd_store_commit_duration_seconds": "histogram",
    "opqd_store_commit_records": "histogram",
    "process_start_time_seconds": "gauge",
    "process_cpu_seconds": "counter",
    "process_resident_memory_bytes": "gauge",
    "process_virtual_memory_bytes": "gauge",
    "process_open_fds": "gauge",
}
# The escapes the text format has; a backslash left after removing them is a bad escape.
ESCAPES = re.compile(r'\\[\\"n]')
# name{label="value",...} value, nothing after.
SAMPLE_LINE = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",?)*\})? (\S+)$')
QUEUE = "metrics-check"
OPERATIONS = 5
WAIT_SECONDS = 60


def fail(message):
    print(f"metrics-check: FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def http(method, url, body=None, timeout=10):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers, error.read()


def run_operations(opqd):
    status, _, body = http("POST", f"{opqd}/v1/queues", {"name": QUEUE, "maxConcurrentOperationCount": 2})
    if status != 201:
        fail(f"creating the queue answered {status}: {body[:300]!r}")
    ids = []
    for _ in range(OPERATIONS):
        status, _, body = http("POST", f"{opqd}/v1/queues/{QUEUE}/operations", {"kind": "delay", "spec": {"seconds": 0.05}})
        if status != 201:
            fail(f"creating an operation answered {status}: {body[:300]!r}")
        ids.append(json.loads(body)["id"])
    deadline = time.monotonic() + 20
    for op in ids:
        while True:
            status, _, body = http("GET", f"{opqd}/v1/operations/{op}")
            if status == 200 and json.loads(body).get("isFinished"):
                break
            if time.monotonic() > deadline:
                fail(f"operation {op} did not finish within 20 s: {status} {body[:300]!r}")
            time.sleep(0.05)


def check_exposition(opqd):
    status, headers, body = http("GET", f"{opqd}/metrics")
    if status != 200:
        fail(f"GET /metrics answered {status}")
    if not headers.get("Content-Type", "").startswith("text/plain; version=0.0.4"):
        fail(f"GET /metrics Content-Type is {headers.get('Content-Type')!r}")
    text = body.decode("utf-8")
    try:
        families = {f.name: f for f in text_string_to_metric_families(text)}
    except Exception as error:  # the parser raises ValueError and friends on malformed input
        fail(f"prometheus_client could not parse /metrics: {error!r}")
    # prometheus_client's parser lets a few things through that Prometheus would take
    # differently: samples of an undeclared family (type "unknown"), a stray third field
    # (read as a timestamp), and unknown escapes in label values. opqd writes none of them.
    for family in families.values():
        if family.type == "unknown":
            fail(f"samples of {family.name} have no # TYPE line")
        for sample in family.samples:
            if sample.timestamp is not None:
                fail(f"{sample.name}{sample.labels} carries a timestamp or a stray field")
    for line in text.splitlines():
        if not line.startswith("#") and "\\" in ESCAPES.sub("", line):
            fail(f"a label value escape other than backslash-backslash, backslash-quote or backslash-n in: {line}")
        if not line.startswith("#") and line and not SAMPLE_LINE.match(line):
            fail(f"not a sample line of the text format: {line}")
    for name, kind in PROMISED.items():
        family = families.get(name)
        if family is None:
            fail(f"family {name} is missing from /metrics")
        if family.type != kind:
            fail(f"family {name} is a {family.type}, expected {kind}")
        if not family.documentation:
            fail(f"family {name} has no HELP text")
    for family in families.values():
        if family.type != "histogram":
            continue
        series = {}
        for sample in family.samples:
            key = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "le"))
            entry = series.setdefault(key, {"buckets": [], "count": None})
            if sample.name.endswith("_bucket"):
                entry["buckets"].append((float(sample.labels["le"]), sample.value))
            elif sample.name.endswith("_count"):
                entry["count"] = sample.value
        for key, entry in series.items():
            bounds = [b for b, _ in entry["buckets"]]
            counts = [c for _, c in entry["buckets"]]
            if not bounds or bounds[-1] != float("inf"):
                fail(f"{family.name}{dict(key)} has no +Inf bucket")
            if bounds != sorted(bounds) or counts != sorted(counts):
                fail(f"{family.name}{dict(key)} buckets are not cumulative: {entry['buckets']}")
            if counts[-1] != entry["count"]:
                fail(f"{family.name}{dict(key)} +Inf bucket {counts[-1]} != _count {entry['count']}")
    finished = [s.value for s in families["opqd_operations"].samples if s.labels == {"queue": QUEUE, "state": "finished"}]
    if finished != [OPERATIONS]:
        fail(f"opqd_operations{{queue={QUEUE!r},state='finished'}} is {finished}, expected [{OPERATIONS}]")
    print(f"metrics-check: /metrics parsed strictly: {len(families)} families, {len(PROMISED)} promised ones present with their types")


def query(prometheus, promql):
    url = f"{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    status, _, body = http("GET", url)
    if status != 200:
        fail(f"Prometheus answered {status} to {promql}: {body[:300]!r}")
    answer = json.loads(body)
    if answer.get("status") != "success":
        fail(f"Prometheus query {promql} failed: {answer}")
    return answer["data"]["result"]


def wait_for(prometheus, promql, expected, deadline):
    last = None
    while time.monotonic() < deadline:
        result = query(prometheus, promql)
        last = [r["value"][1] for r in result]
        if len(result) == 1 and float(result[0]["value"][1]) == expected:
            print(f"metrics-check: Prometheus has {promql} = {expected:g}")
            return
        time.sleep(0.5)
    fail(f"Prometheus never showed {promql} = {expected:g} within {WAIT_SECONDS} s (last: {last})")


def check_prometheus(prometheus):
    deadline = time.monotonic() + WAIT_SECONDS
    scoped = f'job="opqd",queue="{QUEUE}"'
    wait_for(prometheus, f'opqd_operations{{{scoped},state="finished"}}', OPERATIONS, deadline)
    wait_for(prometheus, f'opqd_transitions_total{{{scoped},to="finished"}}', OPERATIONS, deadline)
    wait_for(prometheus, f"opqd_operations_created_total{{{scoped}}}", OPERATIONS, deadline)
    wait_for(prometheus, f"opqd_operation_duration_seconds_count{{{scoped}}}", OPERATIONS, deadline)
    wait_for(prometheus, f'opqd_operation_duration_seconds_bucket{{{scoped},le="+Inf"}}', OPERATIONS, deadline)
    wait_for(prometheus, 'up{job="opqd"}', 1, deadline)
    # Histogram queries work on what was scraped (every operation took at least 0.05 s).
    median = query(prometheus, f"histogram_quantile(0.5, sum by (le) (opqd_operation_duration_seconds_bucket{{{scoped}}}))")
    if len(median) != 1 or not 0.025 <= float(median[0]["value"][1]) <= 1:
        fail(f"histogram_quantile over the duration buckets gave {median}")
    status, _, body = http("GET", f"{prometheus}/api/v1/targets")
    targets = json.loads(body)["data"]["activeTargets"] if status == 200 else []
    mine = [t for t in targets if t["labels"].get("job") == "opqd"]
    if len(mine) != 1:
        fail(f"expected one opqd target, got {mine}")
    if mine[0]["health"] != "up" or mine[0]["lastError"]:
        fail(f"the opqd target is {mine[0]['health']} with error {mine[0]['lastError']!r}")
    # Samples Prometheus refused from a scrape (out of order, duplicate timestamps, out of
    # bounds), from its own /metrics: each must exist and be 0.
    status, _, body = http("GET", f"{prometheus}/metrics")
    own = {s.name: s.value for f in text_string_to_metric_families(body.decode()) for s in f.samples}
    for name in [
        "prometheus_target_scrapes_sample_out_of_order_total",
        "prometheus_target_scrapes_sample_duplicate_timestamp_total",
        "prometheus_target_scrapes_sample_out_of_bounds_total",
    ]:
        if own.get(name) != 0:
            fail(f"Prometheus's {name} is {own.get(name)}, expected 0")
    scraped = query(prometheus, 'scrape_samples_scraped{job="opqd"}')
    if len(scraped) != 1 or float(scraped[0]["value"][1]) < 100:
        fail(f"scrape_samples_scraped for opqd is {scraped}")
    print("metrics-check: the opqd target is up with no scrape error")


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    opqd, prometheus = sys.argv[1].rstrip("/"), sys.argv[2].rstrip("/")
    run_operations(opqd)
    check_exposition(opqd)
    check_prometheus(prometheus)
    print("metrics-check: passed")


if __name__ == "__main__":
    main()
