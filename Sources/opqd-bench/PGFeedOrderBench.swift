// The measuring half of `opqd-bench feed-order` (Sources/opqd-bench/FeedOrderBench.swift): how
// several instances committing to one `events` table can take a global `seq` so that a feed
// reader polling `seq > cursor ORDER BY seq` never skips an event that becomes visible later
// below its cursor, and what each way costs. It uses PostgresStore's own `PGConnection`
// (pipeline mode, one round trip per commit as PGWriter sends them), which that module opens
// to this package's targets with `package` access, so no benchmark is compiled into the server.
import Locking
import PostgresStore
import StoreKit

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

public enum PGFeedOrderBench {
    /// How a commit takes its events' `seq` values.
    public enum Strategy: String, CaseIterable, Sendable {
        /// `nextval` in the INSERT and nothing else: values are handed out before commit, so two
        /// concurrent commits can become visible out of `seq` order (the unsafe baseline).
        case sequence
        /// `pg_advisory_xact_lock` first, then `nextval`: the lock is held to commit, so commits
        /// take values and become visible one after the other, in `seq` order.
        case advisoryLock = "advisory-lock"
        /// A one-row counter bumped by the batch size in the INSERT's own statement: its row lock
        /// serialises the commits as the advisory lock does, and the values have no holes.
        case counterRow = "counter-row"

        /// The letter the report uses: (a), (b), (c).
        public var letter: String {
            switch self {
            case .sequence: return "a"
            case .advisoryLock: return "b"
            case .counterRow: return "c"
            }
        }
    }

    /// A setup or run failure, with the server's message (passwords never appear: the URL is not in it).
    public struct Failure: Error, Sendable, CustomStringConvertible {
        public let description: String
    }

    /// What one run (one strategy, K writers, B events per commit, S seconds) measured.
    public struct Figures: Sendable {
        public let strategy: Strategy
        public let writers: Int
        public let batch: Int
        /// Every commit also sent `pg_notify`, as opqd's writer does once per commit with events.
        public let notify: Bool
        /// From the writers' start to the last one's stop.
        public let seconds: Double
        public let commits: Int
        public let events: Int
        /// Commits that failed (the first one's message in `firstFailure`).
        public let failures: Int
        public let firstFailure: String?
        /// Commit round trips (BEGIN to COMMIT's answer), seconds.
        public let latencyP50: Double
        public let latencyP99: Double
        public let readerPolls: Int
        /// Events the reader returned (each once: its cursor only moves forward).
        public let readerSeen: Int
        public let finalCursor: Int64
        /// Rows in the table at the end; equal to `events` unless a commit's answer was lost.
        public let stored: Int
        /// Events stored at or below the reader's final cursor that it never returned: each one
        /// became visible after the reader had moved past it.
        public let skips: Int
        /// `seq` values between the lowest and the highest stored that no event has.
        public let holes: Int64
        /// The counter table's size after the run (counter-row only): what the one hot row's
        /// dead versions cost before pruning and vacuum catch up.
        public let counterBytes: Int?

        public var commitsPerSecond: Double { seconds > 0 ? Double(commits) / seconds : 0 }
        public var eventsPerSecond: Double { seconds > 0 ? Double(events) / seconds : 0 }
    }

    /// Runs every strategy of `strategies`, each on its own fresh schema of the database at `url`
    /// (dropped afterwards): `writers` threads, each on its own connection, commit transactions of
    /// `batch` events as fast as they can for `seconds` in all, while one reader thread polls the
    /// feed as opqd's would. The strategies take turns in `slices` slices (a, b, c, a, b, c, ...),
    /// so that a disk or a CPU shared with others slows each of them alike rather than whichever
    /// ran at the wrong moment. With `notify`, each commit also sends one `pg_notify`
    /// (PGSchema.notifyEvents), whose commit-time lock serialises every notifying commit on the
    /// server whatever the strategy.
    public static func run(
        url: String, strategies: [Strategy] = Strategy.allCases, writers: Int, batch: Int, seconds: Double, slices: Int = 1, notify: Bool = false
    ) throws(Failure) -> [Figures] {
        let writers = max(1, min(writers, 64))
        let batch = max(1, min(batch, 10_000))
        let seconds = seconds.isFinite ? max(0.1, min(seconds, 600)) : 3
        let slices = max(1, min(slices, 100))
        var contenders: [Contender] = []
        defer { for c in contenders { c.drop() } }
        for strategy in strategies {
            contenders.append(try Contender(url: url, strategy: strategy, writers: writers, batch: batch, notify: notify))
        }
        for _ in 0..<slices {
            for c in contenders { try c.slice(seconds: seconds / Double(slices)) }
        }
        var out: [Figures] = []
        for c in contenders { out.append(try c.figures()) }
        return out
    }

    /// One strategy's schema, connections and running totals across its slices.
    private final class Contender {
        let strategy: Strategy
        let schema: String
        let batch: Int
        let notify: Bool
        let admin: PGConnection
        var writerConnections: [PGConnection] = []
        var readerConnection: PGConnection?
        var statements: CommitStatements
        var results: [WriterResult] = []
        var feed = FeedResult()
        var nanoseconds = 0

        init(url: String, strategy: Strategy, writers: Int, batch: Int, notify: Bool) throws(Failure) {
            self.strategy = strategy
            self.batch = batch
            self.notify = notify
            schema = "opqd_feed_\(strategy.rawValue.split(separator: "-").joined(separator: "_"))_\(UInt32.random(in: 0...UInt32.max))"
            statements = commitStatements(strategy, schema: schema, lockKey: Int64.random(in: 1...Int64.max))
            if notify { statements.after = "SELECT pg_notify('\(schema)', '')" }
            admin = try connect(url)
            do throws(PGFailure) {
                try admin.runScript(
                    """
                    CREATE SCHEMA \(schema);
                    CREATE TABLE \(schema).events (
                        seq bigint PRIMARY KEY, time bigint NOT NULL, queue text NOT NULL, operation bigint NOT NULL,
                        key text NOT NULL, old text, new text, state text NOT NULL);
                    CREATE SEQUENCE \(schema).seq;
                    CREATE TABLE \(schema).counter (last bigint NOT NULL);
                    INSERT INTO \(schema).counter VALUES (0);
                    """)
            } catch { throw Failure(description: "creating schema \(schema): \(error)") }
            // Every connection is made before any clock starts, so the slices measure commits only.
            for _ in 0..<writers {
                let c = try connect(url)
                do throws(PGFailure) { try c.enterPipelineMode() } catch { throw Failure(description: "pipeline mode: \(error)") }
                writerConnections.append(c)
            }
            readerConnection = try connect(url)
            results = (0..<writers).map { WriterResult(nextOperation: Int64($0) &* 1_000_000_000_000) }
        }

        /// Closes the connections, then drops the schema.
        func drop() {
            for c in writerConnections { c.close() }
            readerConnection?.close()
            _ = try? admin.runScript("DROP SCHEMA IF EXISTS \(schema) CASCADE")
            admin.close()
        }

        /// The writers commit for `seconds` while the reader polls; the reader goes on from where
        /// the previous slice left it and stops once it has caught up after the writers stopped.
        func slice(seconds: Double) throws(Failure) {
            guard let readerConnection else { throw Failure(description: "no reader connection") }
            let schema = schema, batch = batch, statements = statements, before = feed
            let firsts = results.map(\.nextOperation)
            let collected = Lock([(Int, WriterResult)]())
            let feedAfter = Lock(before)
            let writersDone = Lock(false)
            let start = clockNanos(CLOCK_MONOTONIC)
            let deadline = start &+ Int(seconds * 1e9)
            let reader = BenchThread.start {
                let r = readFeed(readerConnection, schema: schema, from: before, writersDone: writersDone)
                feedAfter.withLock { $0 = r }
            }
            guard let reader else { throw Failure(description: "cannot start the reader thread") }
            var threads: [BenchThread] = []
            for (w, conn) in writerConnections.enumerated() {
                let t = BenchThread.start {
                    let r = commitUntil(deadline, on: conn, writer: w, from: firsts[w], batch: batch, statements: statements)
                    collected.withLock { $0.append((w, r)) }
                }
                if let t { threads.append(t) }
            }
            for t in threads { t.join() }
            nanoseconds &+= clockNanos(CLOCK_MONOTONIC) &- start
            writersDone.withLock { $0 = true }
            reader.join()
            feed = feedAfter.value
            let got = collected.value
            for (w, r) in got where w < results.count {
                results[w].commits &+= r.commits
                results[w].failures &+= r.failures
                results[w].latencies += r.latencies
                if results[w].firstFailure == nil { results[w].firstFailure = r.firstFailure }
                // Each writer goes on from where it stopped: operation ids never repeat.
                results[w].nextOperation = r.nextOperation
            }
            guard got.count == writerConnections.count else {
                throw Failure(description: "only \(got.count) of \(writerConnections.count) writer threads started")
            }
        }

        /// The totals, and the table read back against what the reader saw.
        func figures() throws(Failure) -> Figures {
            var latencies = results.flatMap(\.latencies)
            latencies.sort()
            let stored: Int, below: Int, low: Int64, high: Int64
            var counterBytes: Int?
            do throws(PGFailure) {
                let t = try admin.exec(
                    "SELECT count(*), coalesce(min(seq), 0), coalesce(max(seq), 0), count(*) FILTER (WHERE seq <= $1::bigint) FROM \(schema).events",
                    [PGParameter(feed.cursor)])
                stored = Int(t.int64(0, 0) ?? 0)
                low = t.int64(0, 1) ?? 0
                high = t.int64(0, 2) ?? 0
                below = Int(t.int64(0, 3) ?? 0)
                if strategy == .counterRow {
                    counterBytes = try admin.exec("SELECT pg_relation_size('\(schema).counter')").int64(0, 0).map { Int($0) }
                }
            } catch { throw Failure(description: "reading the table back: \(error)") }
            let commits = results.reduce(0) { $0 &+ $1.commits }
            return Figures(
                strategy: strategy, writers: writerConnections.count, batch: batch, notify: notify, seconds: Double(nanoseconds) / 1e9,
                commits: commits, events: commits &* batch, failures: results.reduce(0) { $0 &+ $1.failures },
                firstFailure: results.compactMap(\.firstFailure).first ?? feed.failure,
                latencyP50: percentile(latencies, 0.5), latencyP99: percentile(latencies, 0.99),
                readerPolls: feed.polls, readerSeen: feed.seen, finalCursor: feed.cursor, stored: stored,
                skips: max(0, below &- feed.seen), holes: stored > 0 ? max(0, high &- low &+ 1 &- Int64(stored)) : 0,
                counterBytes: counterBytes)
        }
    }

    // MARK: - the writers

    /// The statements of one commit between BEGIN and COMMIT, each with how it takes its
    /// parameters: `$1...$7` are the events' columns as arrays (as PGSchema.insertEvents sends
    /// them), `$8` the batch size where the statement needs it.
    struct CommitStatements: Sendable {
        /// Sent before the INSERT, with no parameters (the advisory lock), if any.
        var before: String?
        var insert: String
        var insertTakesCount: Bool
        /// Sent after the INSERT, with no parameters (the notification), if any.
        var after: String?
    }

    static func commitStatements(_ strategy: Strategy, schema: String, lockKey: Int64) -> CommitStatements {
        let columns = "time, queue, operation, key, old, new, state"
        let arrays = "unnest($1::bigint[], $2::text[], $3::bigint[], $4::text[], $5::text[], $6::text[], $7::text[])"
        let fromSequence = """
            INSERT INTO \(schema).events (seq, \(columns)) \
            SELECT nextval('\(schema).seq'), r.* FROM \(arrays) AS r(\(columns))
            """
        switch strategy {
        case .sequence:
            return CommitStatements(before: nil, insert: fromSequence, insertTakesCount: false)
        case .advisoryLock:
            // The key is a literal: one per run, so two runs on one server never share it.
            return CommitStatements(before: "SELECT pg_advisory_xact_lock(\(lockKey))", insert: fromSequence, insertTakesCount: false)
        case .counterRow:
            return CommitStatements(
                before: nil,
                insert: """
                    WITH c AS (UPDATE \(schema).counter SET last = last + $8::bigint RETURNING last) \
                    INSERT INTO \(schema).events (seq, \(columns)) \
                    SELECT c.last - $8::bigint + r.n, r.time, r.queue, r.operation, r.key, r.old, r.new, r.state \
                    FROM c, \(arrays) WITH ORDINALITY AS r(\(columns), n)
                    """,
                insertTakesCount: true)
        }
    }

    struct WriterResult: Sendable {
        /// The next operation id this writer will use (ids are unique per writer across slices).
        var nextOperation: Int64 = 0
        var commits = 0
        var failures = 0
        var firstFailure: String?
        var latencies: [Double] = []
    }

    /// Commits as fast as it can until `deadline`: each transaction is one round trip (BEGIN,
    /// the statements, COMMIT, sync, then the answers), as PGWriter.apply sends a group commit.
    static func commitUntil(_ deadline: Int, on conn: PGConnection, writer: Int, from first: Int64, batch: Int, statements: CommitStatements) -> WriterResult {
        var out = WriterResult()
        out.latencies.reserveCapacity(1 << 16)
        // Event values of realistic size; the operation ids differ per writer and per commit.
        func repeated(_ text: String) -> String { "{" + Array(repeating: text, count: batch).joined(separator: ",") + "}" }
        let queue = PGParameter(repeated("q\(writer)"))
        let key = PGParameter(repeated("state"))
        let old = PGParameter(repeated("ready"))
        let new = PGParameter(repeated("running"))
        let count = PGParameter(batch)
        var operation = first
        while clockNanos(CLOCK_MONOTONIC) < deadline {
            let now = Int64(clockNanos(CLOCK_REALTIME))
            var ids: [String] = []
            ids.reserveCapacity(batch)
            for _ in 0..<batch {
                operation &+= 1
                ids.append(String(operation))
            }
            var parameters = [
                PGParameter(repeated(String(now))), queue, PGParameter("{" + ids.joined(separator: ",") + "}"), key, old, new, new,
            ]
            if statements.insertTakesCount { parameters.append(count) }
            let started = clockNanos(CLOCK_MONOTONIC)
            do throws(PGFailure) {
                var sent = 0
                try conn.send("BEGIN"); sent += 1
                if let before = statements.before { try conn.send(before); sent += 1 }
                try conn.send(statements.insert, parameters); sent += 1
                if let after = statements.after { try conn.send(after); sent += 1 }
                try conn.send("COMMIT"); sent += 1
                try conn.sync()
                _ = try conn.readPipeline(count: sent)
                out.commits += 1
                out.latencies.append(Double(clockNanos(CLOCK_MONOTONIC) &- started) / 1e9)
            } catch {
                out.failures += 1
                if out.firstFailure == nil { out.firstFailure = error.description }
                // A half-written pipeline or a broken connection: this writer stops.
                if !conn.isUsable || error.connectionLost { break }
            }
        }
        out.nextOperation = operation
        return out
    }

    // MARK: - the reader

    struct FeedResult: Sendable {
        var polls = 0
        var seen = 0
        var cursor: Int64 = 0
        var failure: String?
    }

    /// Polls `seq > cursor ORDER BY seq LIMIT 1000` back to back from `start`'s cursor, moving the
    /// cursor to the last seq read, as a feed reader does; stops at the first short page read after the writers stopped
    /// (every commit is visible then). Each seq comes back at most once, so counting is enough.
    static func readFeed(_ conn: PGConnection, schema: String, from start: FeedResult, writersDone: Lock<Bool>) -> FeedResult {
        var out = start
        let sql = "SELECT seq FROM \(schema).events WHERE seq > $1::bigint ORDER BY seq LIMIT 1000"
        while out.failure == nil {
            let finished = writersDone.value
            do throws(PGFailure) {
                let page = try conn.exec(sql, [PGParameter(out.cursor)])
                out.polls += 1
                for row in 0..<page.rows {
                    guard let seq = page.int64(row, 0), seq > out.cursor else { continue }
                    out.cursor = seq
                    out.seen += 1
                }
                if finished && page.rows < 1000 { return out }
            } catch {
                out.failure = "reader: \(error)"
            }
        }
        return out
    }

    // MARK: - pieces

    static func connect(_ url: String) throws(Failure) -> PGConnection {
        do throws(PGFailure) { return try PGConnection(url: url) } catch { throw Failure(description: "connecting: \(error)") }
    }

    static func percentile(_ sorted: [Double], _ p: Double) -> Double {
        guard !sorted.isEmpty else { return 0 }
        let i = min(sorted.count - 1, max(0, Int((p * Double(sorted.count)).rounded(.up)) - 1))
        return sorted[i]
    }
}

/// One pthread running `body`; `join` waits for it. Plain threads, not Dispatch: every writer
/// blocks on the network all the time, and each must have its own thread from the start.
private final class BenchThread: @unchecked Sendable {  // `thread` is touched only by the creating thread
    private let body: @Sendable () -> Void
    private var thread: pthread_t?

    private init(_ body: @escaping @Sendable () -> Void) { self.body = body }

    /// The running thread, or nil when the system would not start one.
    static func start(_ body: @escaping @Sendable () -> Void) -> BenchThread? {
        let t = BenchThread(body)
        let context = Unmanaged.passRetained(t).toOpaque()
        var tid = pthread_t()
        let rc = pthread_create(
            &tid, nil,
            { arg in
                guard let arg else { return nil }
                Unmanaged<BenchThread>.fromOpaque(arg).takeRetainedValue().body()
                return nil
            }, context)
        if rc != 0 {
            Unmanaged<BenchThread>.fromOpaque(context).release()
            return nil
        }
        t.thread = tid
        return t
    }

    func join() {
        guard let t = thread else { return }
        pthread_join(t, nil)
        thread = nil
    }
}
