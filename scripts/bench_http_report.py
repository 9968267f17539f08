"""The report of scripts/bench-http.sh: parses wrk's output and prints a table, then one JSON object.

usage: python3 scripts/bench_http_report.py WRK_OUT_DIR CREATED CREATED_MEMORY CONNECTIONS [CREATED_KEYED]
WRK_OUT_DIR holds NAME.ROUND.txt for each workload; CREATED and CREATED_MEMORY are the
operations each server held afterwards (every create wrk saw acknowledged must be among them).
"""
import glob, json, re, sys, os
out, created, created_memory, conns = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
created_keyed = int(sys.argv[5]) if len(sys.argv) > 5 else None
def parse(path):
    t = open(path).read()
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", t).group(1))
    m = re.search(r"99%\s+([\d.]+)(us|ms|s)\b", t)
    p99 = float(m.group(1)) * {"us": 0.001, "ms": 1, "s": 1000}[m.group(2)]
    errs = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", t)
    sock = re.search(r"Socket errors: (.*)", t)
    total = int(re.search(r"(\d+) requests in", t).group(1))
    return rps, p99, int(errs.group(1)) if errs else 0, sock.group(1) if sock else "", total
names = ["bare", "get", "poll304", "create", "create_memory"] + (["create_keyed"] if created_keyed is not None else [])
res = {}
for name in names:
    runs = [parse(p) for p in sorted(glob.glob(f"{out}/{name}.*.txt"))]
    best = max(runs, key=lambda x: x[0])
    res[name] = {"rps": best[0], "p99_ms": best[1], "non2xx": sum(r[2] for r in runs), "socket": [r[3] for r in runs if r[3]],
                 "all_rps": [round(r[0]) for r in runs], "ok": sum(r[4] - r[2] for r in runs)}
bare = res["bare"]["rps"]
print(f"{'workload':<34}{'req/s (best)':>14}{'p99 ms':>10}{'ratio':>8}  runs")
labels = {"bare": "bare C libmicrohttpd", "get": "GET /v1/operations/{id}", "poll304": "If-None-Match -> 304",
          "create": "POST create (sqlite, sync full)", "create_memory": "POST create (--store memory)",
          "create_keyed": "POST create + Idempotency-Key (full)"}
for k in names:
    r = res[k]
    print(f"{labels[k]:<34}{r['rps']:>14,.0f}{r['p99_ms']:>10.2f}{r['rps']/bare:>8.2f}  {r['all_rps']}" + (f"  non-2xx/3xx: {r['non2xx']}" if r['non2xx'] else "") + (f"  socket errors: {r['socket']}" if r['socket'] else ""))
lost = max(0, res["create"]["ok"] - created) + (max(0, res["create_keyed"]["ok"] - created_keyed) if created_keyed is not None else 0)
lost_memory = max(0, res["create_memory"]["ok"] - created_memory)
print(f"creates acknowledged (2xx seen by wrk) / held by the server: sqlite {res['create']['ok']} / {created}, memory {res['create_memory']['ok']} / {created_memory}")
if created_keyed is not None:
    print(f"keyed creates acknowledged / held: {res['create_keyed']['ok']} / {created_keyed}")
print(f"durable / memory create ratio: {res['create']['rps'] / res['create_memory']['rps']:.3f}")
if lost or lost_memory:
    print(f"!!!! LOST ACKNOWLEDGED CREATES: sqlite {lost}, memory {lost_memory}")
summary = {
    "bare_rps": round(bare), "get_rps": round(res["get"]["rps"]), "poll304_rps": round(res["poll304"]["rps"]), "create_rps": round(res["create"]["rps"]),
    "get_ratio": round(res["get"]["rps"] / bare, 3), "poll304_ratio": round(res["poll304"]["rps"] / bare, 3), "create_ratio": round(res["create"]["rps"] / bare, 3),
    "bare_p99_ms": res["bare"]["p99_ms"], "get_p99_ms": res["get"]["p99_ms"], "poll304_p99_ms": res["poll304"]["p99_ms"], "create_p99_ms": res["create"]["p99_ms"],
    "connections": conns, "created_operations": created,
    "create_memory_rps": round(res["create_memory"]["rps"]), "create_memory_ratio": round(res["create_memory"]["rps"] / bare, 3),
    "create_memory_p99_ms": res["create_memory"]["p99_ms"], "created_memory_operations": created_memory,
    "create_durable_to_memory_ratio": round(res["create"]["rps"] / res["create_memory"]["rps"], 3),
    "create_store": "sqlite-full", "lost_acknowledged": lost + lost_memory,
}
if created_keyed is not None:
    summary.update({"create_keyed_rps": round(res["create_keyed"]["rps"]), "create_keyed_ratio": round(res["create_keyed"]["rps"] / bare, 3),
                    "create_keyed_p99_ms": res["create_keyed"]["p99_ms"], "created_keyed_operations": created_keyed})
print(json.dumps(summary))
