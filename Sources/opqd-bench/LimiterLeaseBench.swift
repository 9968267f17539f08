// `opqd-bench limiter-leases`: the round trip of a limiter lease exchange (`PGLimiterLeases`,
// schema 11) for 1 key and for 50 keys in one call, median and p99 over N exchanges, beside
// the same exchanges sent as a pipeline of one statement per key inside BEGIN/COMMIT (the
// other way to make them one transaction in one round trip), the cost of a limiter with 1,000
// overrides (its JSON parsed once per exchange; once per key in the pipeline form), exchanges
// whose commit does not wait for the WAL flush (`durableCommits: false`), and a renewal and a `held` read. One fresh database on
// URL, dropped afterwards; every exchange asks for a slot and a token of each key (the budgets
// are large enough never to refuse), so each one writes both rows of every key.
import Foundation
import PostgresStore
import QueueEngine

enum LimiterLeaseBench {
    static let usage =
        "usage: opqd-bench limiter-leases --postgres URL [--samples 200]\n"
        + "  URL: a server opqd may create databases on (scripts/pg.sh start DIR prints one); default $OPQD_TEST_POSTGRES_URL\n"

    static func main(_ args: [String]) -> Int32 {
        var server = TestPostgres.serverURL
        var samples = 200
        var i = 0
        while i < args.count {
            let value = i + 1 < args.count ? args[i + 1] : nil
            switch (args[i], value) {
            case let ("--postgres", v?): server = v
            case let ("--samples", v?):
                guard let n = Int(v), (1...100_000).contains(n) else {
                    eprint("opqd-bench limiter-leases: --samples wants a count from 1 to 100000\n" + usage)
                    return 2
                }
                samples = n
            default:
                eprint("opqd-bench limiter-leases: unknown option '\(args[i])'\n" + usage)
                return 2
            }
            i += 2
        }
        guard let server else {
            eprint("opqd-bench limiter-leases: no PostgreSQL server: pass --postgres URL\n" + usage)
            return 2
        }
        let database = "opqd_bench_leases_\(UInt64.random(in: 0...UInt64.max))"
        do { try TestPostgres.psql(server, "CREATE DATABASE \(database)") } catch {
            eprint("opqd-bench limiter-leases: \(error)\n")
            return 1
        }
        defer { _ = try? TestPostgres.psql(server, "DROP DATABASE IF EXISTS \(database) WITH (FORCE)") }
        do {
            try run(url: TestPostgres.url(server, database: database), server: server, samples: samples)
            return 0
        } catch {
            eprint("opqd-bench limiter-leases: \(error)\n")
            return 1
        }
    }

    static func run(url: String, server: String, samples: Int) throws {
        let big = LimiterSettings(concurrency: 1_000_000_000, rate: RateLimit(perSecond: 100_000, burst: 1_000_000_000))
        var crowded = big
        for k in 0..<1000 { crowded.overrides["override-\(k)"] = LimiterBudget(concurrency: 1_000_000) }
        let store = try PostgresStore(url: url)
        store.append(
            [
                .limiter(LimiterSnapshot(name: "l", settings: big, createdAt: Timestamp(nanoseconds: 0), revision: 1)),
                .limiter(LimiterSnapshot(name: "o", settings: crowded, createdAt: Timestamp(nanoseconds: 0), revision: 1)),
            ], upTo: 1)
        let written = DispatchSemaphore(value: 0)
        store.whenDurable(1) { written.signal() }
        guard written.wait(timeout: .now() + 10) == .success, store.lastError == nil else {
            store.close()
            throw TestClientError("the limiters were not written: \(String(describing: store.lastError))")
        }
        store.close()

        print("opqd-bench limiter-leases: one exchange of K keys (a slot and a token each), \(samples) times back to back")
        print(BenchSupport.machineLine())
        if let v = try? TestPostgres.psql(server, "SELECT version()") { print("postgres: \(PostgresStore.redact(server)): \(v)") }
        print("")
        print(
            ["what", "p50 ms", "p99 ms", "mean ms"].enumerated().map { BenchSupport.pad($0.element, $0.offset == 0 ? 44 : 8, right: $0.offset > 0) }.joined(
                separator: " "))

        let leases = PGLimiterLeases(url: url, instance: "bench", leaseSeconds: 30)
        defer { leases.close() }
        func requests(_ limiter: String, _ n: Int) -> [LeaseRequest] {
            (0..<n).map { LeaseRequest(limiter: limiter, key: "key-\($0)", keepSlots: 1, wantSlots: 1, wantTokens: 1) }
        }
        for (what, limiter, n) in [
            ("exchange, 1 key (one statement)", "l", 1), ("exchange, 50 keys (one statement)", "l", 50),
            ("exchange, 50 keys, limiter with 1,000 overrides", "o", 50),
        ] {
            let rs = requests(limiter, n)
            _ = try leases.exchange(rs)
            report(what, try measure(samples) { _ = try leases.exchange(rs) })
        }
        // Without waiting for the WAL flush at commit (`durableCommits: false`).
        let quick = PGLimiterLeases(url: url, instance: "bench-async", leaseSeconds: 30, durableCommits: false)
        defer { quick.close() }
        for n in [1, 50] {
            let rs = requests("l", n)
            _ = try quick.exchange(rs)
            report("exchange, \(n) key\(n == 1 ? "" : "s") (synchronous_commit off)", try measure(samples) { _ = try quick.exchange(rs) })
        }
        try quick.releaseAll()

        // The same exchanges as a pipeline: BEGIN, one prepared statement per key, COMMIT.
        let c = try PGConnection(url: url)
        defer { c.close() }
        try c.enterPipelineMode()
        try c.prepare([
            (
                "bench_exchange",
                "SELECT * FROM opqd.limiter_exchange($1, $2, $3::bytea, $4::bigint, $5::bigint, $6::bigint, $7::bigint, opqd.read_limiter($2))"
            )
        ])
        for n in [1, 50] {
            let pipelined = { () throws(PGFailure) in
                try c.send("BEGIN")
                for k in 0..<n {
                    try c.send(
                        prepared: "bench_exchange",
                        [
                            PGParameter("pipeline"), PGParameter("l"), PGParameter(bytea: Array("key-\(k)".utf8)), PGParameter(1), PGParameter(1),
                            PGParameter(1), PGParameter(Int64(30_000_000_000)),
                        ])
                }
                try c.send("COMMIT")
                try c.sync()
                _ = try c.readPipeline(count: n + 2)
            }
            try pipelined()
            report("exchange, \(n) key\(n == 1 ? "" : "s") (pipeline, BEGIN/COMMIT)", try measure(samples) { try pipelined() })
        }

        report("renew (100 keys held)", try measure(samples) { _ = try leases.renew() })
        report("held(limiter:) (50 keys)", try measure(samples) { _ = try leases.held(limiter: "l") })
        try leases.releaseAll()
    }

    /// Seconds per call, `samples` calls.
    static func measure(_ samples: Int, _ body: () throws -> Void) throws -> [Double] {
        var out: [Double] = []
        out.reserveCapacity(samples)
        for _ in 0..<samples {
            let start = BenchSupport.now()
            try body()
            out.append(BenchSupport.now() - start)
        }
        return out.sorted()
    }

    static func report(_ what: String, _ sorted: [Double]) {
        guard !sorted.isEmpty else { return }
        let p50 = sorted[sorted.count / 2]
        let p99 = sorted[min(sorted.count - 1, Int(Double(sorted.count) * 0.99))]
        let mean = sorted.reduce(0, +) / Double(sorted.count)
        let cells = [what, BenchSupport.fmt(p50 * 1000, 3), BenchSupport.fmt(p99 * 1000, 3), BenchSupport.fmt(mean * 1000, 3)]
        print(cells.enumerated().map { BenchSupport.pad($0.element, $0.offset == 0 ? 44 : 8, right: $0.offset > 0) }.joined(separator: " "))
    }
}
