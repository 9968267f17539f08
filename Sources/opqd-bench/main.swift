// opqd-bench: a small dispatcher of benchmark subcommands.
//
//   opqd-bench engine [--quick]      engine vs Foundation.OperationQueue (EngineBench.swift)
//   opqd-bench http [--quick]        scripts/bench-http.sh: bare libmicrohttpd vs opqd (HTTPBench.swift)
//   opqd-bench store [--quick]       durable creates/s over HTTP, restart time (StoreBench.swift)
//   opqd-bench workers [--quick]     external jobs/s with claim/finish workers (WorkersBench.swift)
//   opqd-bench watch [--quick]       SSE latency, many SSE clients, webhook fan-out (WatchBench.swift)
//   opqd-bench bulk [N]              the engine's share of bulk cancel and filtered listing (BulkBench.swift)
//   opqd-bench batch [--quick]       durable creates via POST /v1/operations:batch vs single creates (BatchBench.swift)
//   opqd-bench pgstore --postgres U  --store postgres:// vs SQLite --sync full, HTTP and store alone (PGStoreBench.swift)
//   opqd-bench cluster --postgres U  1, 2, 3 instances on one PostgreSQL vs one on SQLite (ClusterBench.swift)
//   opqd-bench feed-order --postgres U  a global event seq from K writers: cost and feed skips (FeedOrderBench.swift)
//   opqd-bench flow [--baseline-bin B]  what flow control costs the engine (FlowBench.swift; scripts/bench-flow.sh)
//   opqd-bench limiter-leases --postgres U  limiter lease exchanges, 1 and 50 keys: round trip (LimiterLeaseBench.swift)
//   opqd-bench hosts [--quick]       a target down and back: CPU and memory of held operations, the ramp (HostsBench.swift)
//
// Hidden subcommands used by `engine` to run each measurement in a fresh process:
//   opqd-bench engine-mem engine|foundation [--quick]
//   opqd-bench engine-run engine|foundation flat|chain|fanin|chain-suspended|fanin-suspended N
// by `flow` (and run in the baseline binary too: `engine-run` must keep its form):
//   opqd-bench flow-run limiter|fair N KEYS
//   opqd-bench flow-run decide SAMPLES BLOCKED
// and by `store` to build a big data dir in a child process:
//   opqd-bench store-build DIR N
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

let usage = """
    usage: opqd-bench <subcommand> [options]

    subcommands:
      engine [--quick]   engine vs Foundation.OperationQueue: throughput (flat, chain, fan-in),
                         memory per queued operation, and linearity; last line is one JSON object.
                         --quick divides every size by 10 (smoke tests).
      http [--quick]     scripts/bench-http.sh: a bare C libmicrohttpd server vs opqd (GET, 304, POST
                         create with sqlite sync full and with --store memory), with wrk.
      store [--quick] [--duration S] [--restart-ops N] [--skip-http] [--skip-restart]
                         durable creates/s over HTTP (--sync full, --sync normal, --store memory side by
                         side, 50 and 256 connections, acknowledged creates checked live and after
                         kill -9), and restart time of a store holding 1,000,000 operations.
                         --quick: 2 s runs, 100,000 operations.
      workers [--workers 8] [--jobs N] [--max-concurrent 64] [--stores memory,normal,full] [--quick]
                         external operations end to end: W raw keep-alive HTTP/1.1 workers claim and
                         finish N jobs; jobs/s and claim latency per store. --quick: 10,000 jobs.
      watch [--quick] [--clients 1000] [--observers 100] [--rate 10000]
                         change -> SSE client latency p50/p99 idle and under --rate changes/s (sync full
                         and memory); N concurrent SSE clients with server RSS per client and the time
                         one change takes to reach them all; webhook fan-out to a local receiver with
                         M queue observers (deliveries/s, order). --quick: fewer samples.
      bulk [N]           the engine alone on a queue of N operations (default 100,000): one bulk cancel
                         (flat and fan-in) vs N single cancels, and a filtered listing page with and
                         without the 10,000-operation scan budget.

      batch [--batches N] [--size 1000] [--singles N] [--connections 4] [--sync full] [--quick]
                         durable creates through POST /v1/operations:batch (N batches of a 1,000-operation
                         graph over 4 queues) vs single creates: batches/s and operations/s side by side.
      pgstore --postgres URL [--singles N] [--batches N] [--connections 32] [--serial N] [--flood N] [--quick]
                         --store postgres:// vs SQLite --sync full in the same run: durable creates/s over
                         HTTP (single and 1,000-operation batches) with commits and records per commit, and
                         the store alone (commit latency, flood of appends). Fresh databases on URL
                         (default $OPQD_TEST_POSTGRES_URL; scripts/pg.sh start DIR prints one).
      cluster --postgres URL [--seconds 5] [--clients 16] [--workers 8] [--jobs 50000] [--batch 50] [--instances 1,2,3] [--quick]
                         one opqd on SQLite, then 1, 2 and 3 instances on one fresh PostgreSQL database each:
                         durable creates/s and external jobs/s with clients and workers round-robin over the
                         instances, CPU seconds per 1,000 operations of each opqd process and of a local PostgreSQL (/proc), and GET
                         latency p50/p99 to the owner (direct) vs to a non-owner (forwarded).
      feed-order --postgres URL [--seconds 3] [--writers 1,2,4] [--batch 1,32] [--notify]
                         a global event seq from K concurrent writers on one table: (a) nextval alone,
                         (b) advisory lock + nextval, (c) one-row counter; commits/s, events/s, commit
                         latency p50/p99, and events a polling feed reader skipped (fresh database on URL).
                         --notify: every commit also sends one pg_notify, as opqd's writer does.
      flow [--baseline-bin PATH] [--rounds 3] [--no-instructions] [--quick]
                         what flow control costs the engine: the flat benchmark with no limits in this binary
                         and in PATH (an opqd-bench built without flow control; scripts/bench-flow.sh builds
                         one), ops/s, instructions per op (perf, else callgrind) and bytes per queued op; starts/s with one limiter
                         of 10,000 keys and with 1,000 fairness keys (100,000 ops); one start decision at
                         p50/p99, alone and with 10,000 and 100,000 operations blocked. --quick (< 30 s): fewer
                         samples and counted operations, and 1,000 and 10,000 blocked.
      limiter-leases --postgres URL [--samples 200]
                         limiter budgets shared by a cluster (PGLimiterLeases): the round trip of one lease
                         exchange of 1 and of 50 keys (p50/p99), one statement vs a pipeline of one per key,
                         a limiter with 1,000 overrides, a renewal; a fresh database on URL.
      hosts [--ops N] [--idle 10] [--quick]
                         a local target (TestKit's SwitchableTarget) goes down: 100,000 http operations
                         (--quick: 10,000) held by its open breaker, the process's CPU over --idle seconds
                         while they wait, bytes per held vs per ready operation (fresh processes), then the
                         target comes back: starts per second through the ramp, when the queue's limit (64
                         executing) is reached after the canary's success, the drain.

    Built only when asked: OPQD_BENCH=1 swift build -c release --product opqd-bench (Package.swift).
    Every HTTP benchmark starts its own opqd (built next to this executable, or OPQD_BIN) on
    127.0.0.1 with fresh temporary data dirs, and stops it; build it first with
    swift build -c release --product opqd (this executable does not, and an old one is used as is).
    """

var args = Array(CommandLine.arguments.dropFirst())
let command = args.isEmpty ? "" : args.removeFirst()
switch command {
case "engine":
    exit(EngineBench.main(args))
case "engine-mem":
    exit(EngineBench.memChild(args))
case "engine-run":
    exit(EngineBench.runChild(args))
case "http":
    exit(HTTPBench.main(args))
case "store":
    exit(StoreBench.main(args))
case "store-build":
    exit(StoreBench.buildChild(args))
case "workers":
    exit(WorkersBench.main(args))
case "watch":
    exit(WatchBench.main(args))
case "bulk":
    exit(BulkBench.main(args))
case "batch":
    exit(BatchBench.main(args))
case "pgstore":
    exit(PGStoreBench.main(args))
case "cluster":
    exit(ClusterBench.main(args))
case "feed-order":
    exit(FeedOrderBench.main(args))
case "flow":
    exit(FlowBench.main(args))
case "flow-run":
    exit(FlowBench.runChild(args))
case "limiter-leases":
    exit(LimiterLeaseBench.main(args))
case "hosts":
    exit(HostsBench.main(args))
case "hosts-mem":
    exit(HostsBench.memChild(args))
case "-h", "--help", "help":
    print(usage)
    exit(0)
default:
    if !command.isEmpty { eprint("opqd-bench: unknown subcommand '\(command)'\n") }
    eprint(usage + "\n")
    exit(2)
}
