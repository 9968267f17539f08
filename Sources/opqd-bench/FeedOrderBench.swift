// `opqd-bench feed-order`: how several opqd instances committing events to one PostgreSQL table
// can take a global `seq` without a feed reader ever skipping an event (shared/CLUSTER.md, "Events
// and the feed"), and what each way costs. For each strategy, K writer threads (own connection
// each) commit transactions of B events as fast as they can for S seconds, one round trip per
// commit, synchronous_commit as the server has it; one reader polls `seq > cursor ORDER BY seq
// LIMIT 1000` meanwhile and, at the end, every stored event at or below its final cursor that it
// never returned is a skip:
//   (a) sequence       `nextval` in the INSERT, no lock: the unsafe baseline;
//   (b) advisory-lock  `pg_advisory_xact_lock` then the same INSERT: commits in seq order;
//   (c) counter-row    a one-row counter bumped in the INSERT's statement: serialised, no holes.
// With --notify every commit also sends one pg_notify, as opqd's writer does: its commit-time
// lock serialises notifying commits whatever the strategy, so the baseline moves.
// For each K and B the three take turns in slices of about a second (a, b, c, a, b, c, ...), so
// a disk or CPU shared with other work slows them alike. Each strategy has its own fresh schema
// in one fresh database, both dropped afterwards. The
// measuring is PGFeedOrderBench.swift beside it, on PostgresStore's own connection.
import Foundation
import PostgresStore

enum FeedOrderBench {
    static let usage =
        "usage: opqd-bench feed-order --postgres URL [--seconds S] [--writers 1,2,4] [--batch 1,32] [--notify]\n"
        + "  --notify: every commit also sends one pg_notify, as opqd's writer does (its lock serialises commits)\n"
        + "  URL: a server opqd may create databases on (scripts/pg.sh start DIR prints one); default $OPQD_TEST_POSTGRES_URL\n"

    static func main(_ args: [String]) -> Int32 {
        var server = TestPostgres.serverURL
        var seconds = 3.0
        var writers = [1, 2, 4]
        var batches = [1, 32]
        var notify = false
        var i = 0
        while i < args.count {
            let value = i + 1 < args.count ? args[i + 1] : nil
            switch (args[i], value) {
            case ("--notify", _): notify = true; i -= 1
            case let ("--postgres", v?): server = v
            case let ("--seconds", v?):
                guard let s = Double(v), s.isFinite, s > 0 else {
                    eprint("opqd-bench feed-order: --seconds wants a positive number\n" + usage)
                    return 2
                }
                seconds = min(s, 600)
            case let ("--writers", v?): writers = list(v, 1...64)
            case let ("--batch", v?): batches = list(v, 1...10_000)
            default:
                eprint("opqd-bench feed-order: unknown option '\(args[i])'\n" + usage)
                return 2
            }
            i += 2
        }
        guard let server else {
            eprint("opqd-bench feed-order: no PostgreSQL server: pass --postgres URL\n" + usage)
            return 2
        }
        guard !writers.isEmpty, !batches.isEmpty else {
            eprint("opqd-bench feed-order: --writers and --batch want comma-separated counts (1-64 and 1-10000)\n" + usage)
            return 2
        }

        // About one slice a second, each strategy taking its turn in each: a disk or CPU shared
        // with others then slows all three alike.
        let slices = max(1, min(10, Int(seconds.rounded())))
        let database = "opqd_bench_feed_\(UInt64.random(in: 0...UInt64.max))"
        do { try TestPostgres.psql(server, "CREATE DATABASE \(database)") } catch {
            eprint("opqd-bench feed-order: \(error)\n")
            return 1
        }
        defer { _ = try? TestPostgres.psql(server, "DROP DATABASE IF EXISTS \(database) WITH (FORCE)") }
        let url = TestPostgres.url(server, database: database)

        print("opqd-bench feed-order: a global seq for events committed by K concurrent writers, and a feed reader that must not skip")
        print(BenchSupport.machineLine())
        if let settings = try? TestPostgres.psql(
            server,
            "SELECT version() || '; fsync=' || current_setting('fsync') || ', synchronous_commit=' || current_setting('synchronous_commit')")
        {
            print("postgres: \(PostgresStore.redact(server)): \(settings.trimmingCharacters(in: .whitespacesAndNewlines))")
        }
        print(
            "each run: K writers x \(BenchSupport.fmt(seconds, 1)) s, commits of B events\(notify ? " and one pg_notify" : "") in one round trip each (pipeline), the strategies taking turns in \(slices) slice(s); one reader polling "
                + "seq > cursor ORDER BY seq LIMIT 1000 back to back; a fresh schema per run")
        print("")
        let columns: [(String, Int)] = [
            ("strategy", 17), ("K", 2), ("B", 3), ("commits/s", 10), ("events/s", 10), ("vs (a)", 7), ("p50 ms", 7), ("p99 ms", 7),
            ("polls", 7), ("events", 8), ("seen", 8), ("skips", 6), ("holes", 6), ("counter KB", 10), ("failed", 6),
        ]
        print(columns.map { BenchSupport.pad($0.0, $0.1, right: $0.0 != "strategy") }.joined(separator: " "))

        var all: [PGFeedOrderBench.Figures] = []
        var problems: [String] = []
        for batch in batches {
            for k in writers {
                let figures: [PGFeedOrderBench.Figures]
                do {
                    figures = try PGFeedOrderBench.run(url: url, writers: k, batch: batch, seconds: seconds, slices: slices, notify: notify)
                } catch {
                    problems.append("K=\(k) B=\(batch): \(error)")
                    print("K=\(k) B=\(batch) failed: \(error)")
                    continue
                }
                let baseline = figures.first { $0.strategy == .sequence }?.eventsPerSecond
                for f in figures {
                    let strategy = f.strategy
                    all.append(f)
                    let ratio = baseline.map { $0 > 0 ? BenchSupport.fmt(f.eventsPerSecond / $0, 2) : "-" } ?? "-"
                    let cells = [
                        "(\(strategy.letter)) \(strategy.rawValue)", String(k), String(batch), BenchSupport.grouped(f.commitsPerSecond),
                        BenchSupport.grouped(f.eventsPerSecond), ratio, BenchSupport.fmt(f.latencyP50 * 1000, 2), BenchSupport.fmt(f.latencyP99 * 1000, 2),
                        String(f.readerPolls), String(f.stored), String(f.readerSeen), String(f.skips), String(f.holes),
                        f.counterBytes.map { BenchSupport.fmt(Double($0) / 1024, 0) } ?? "-", String(f.failures),
                    ]
                    print(zip(cells, columns).map { BenchSupport.pad($0, $1.1, right: $1.0 != "strategy") }.joined(separator: " "))
                    if let why = f.firstFailure { problems.append("(\(strategy.letter)) K=\(k) B=\(batch): \(f.failures) failed commits, first: \(why)") }
                    if f.stored != f.events {
                        problems.append("(\(strategy.letter)) K=\(k) B=\(batch): \(f.stored) events stored, \(f.events) committed")
                    }
                    if strategy != .sequence && f.skips > 0 {
                        problems.append("(\(strategy.letter)) K=\(k) B=\(batch): the reader skipped \(f.skips) events; this strategy must never skip")
                    }
                    if strategy == .counterRow && f.holes > 0 { problems.append("(c) K=\(k) B=\(batch): \(f.holes) holes in seq; the counter must leave none") }
                }
            }
        }
        print("")
        print(
            "vs (a) = events/s over (a)'s with the same K and B; events = stored in the run, seen = returned to the reader; skips = events at or below the reader's final cursor it never returned;"
        )
        print("holes = seq values between the lowest and highest stored that no event has; counter KB = the counter table's heap after the run.")
        let unsafe = all.filter { $0.strategy == .sequence && $0.writers > 1 }
        if !unsafe.isEmpty {
            let skipped = unsafe.reduce(0) { $0 &+ $1.skips }
            print(
                "(a) with K > 1: \(skipped) skips in \(unsafe.count) runs"
                    + (skipped == 0 ? " (the race did not show this time: (a) is still unsafe, commits can become visible out of seq order)" : ""))
        }
        for p in problems { print("PROBLEM: \(p)") }
        var summary: [(String, Any)] = [("seconds", seconds), ("notify", notify), ("ok", problems.isEmpty)]
        summary.append(
            (
                "runs",
                all.map { f -> [(String, Any)] in
                    [
                        ("strategy", f.strategy.rawValue), ("writers", f.writers), ("batch", f.batch),
                        ("commits_per_s", Int(f.commitsPerSecond.rounded())), ("events_per_s", Int(f.eventsPerSecond.rounded())),
                        ("p50_ms", BenchSupport.round3(f.latencyP50 * 1000)), ("p99_ms", BenchSupport.round3(f.latencyP99 * 1000)),
                        ("skips", f.skips), ("holes", Int(f.holes)),
                    ]
                }
            ))
        print(BenchSupport.jsonLine(summary))
        return problems.isEmpty ? 0 : 1
    }

    /// Comma-separated counts within `range`, each once, in the order given; others are dropped.
    static func list(_ text: String, _ range: ClosedRange<Int>) -> [Int] {
        var out: [Int] = []
        for part in text.split(separator: ",") {
            if let n = Int(part.trimmingCharacters(in: .whitespaces)), range.contains(n), !out.contains(n) { out.append(n) }
        }
        return out
    }
}
