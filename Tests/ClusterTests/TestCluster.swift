import Foundation
import Locking
import PostgresStore
import TestKit
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Three (or `size`) real `opqd` processes on one fresh PostgreSQL database of their own
/// (`OPQD_TEST_POSTGRES_URL`'s server), each `--store <database> --port 0 --lease 2`.
final class TestCluster: @unchecked Sendable {  // `nodes` is set once in init
    /// Seconds of the ownership lease every instance is started with.
    static let lease = 2.0

    /// The database, as the test reaches it (psql).
    let database: String
    let logs: String
    let nodes: [ClusterNode]
    /// The instances' network namespaces, when they run in some.
    let lab: NetworkLab?

    /// `lab`: runs instance i in the lab's namespace i (reaching PostgreSQL through its relay);
    /// the cluster tears the lab down at `shutdown`. `arguments`: more for every instance.
    init(size: Int = 3, name: String, lab: NetworkLab? = nil, arguments: [String] = []) throws {
        self.lab = lab
        let binary: String
        do {
            binary = try OpqdBinary.locate()
            database = try TestPostgres.createDatabase()
        } catch {
            lab?.tearDown()
            throw error
        }
        var started: [ClusterNode] = []
        var logs = ""
        do {
            logs = try makeTemporaryDirectory(prefix: "opqd-cluster-\(name)")
            let store = try lab?.relayedURL(database) ?? database
            for i in 0..<size {
                started.append(
                    try ClusterNode(
                        index: i, binary: binary, arguments: ["--store", store, "--lease", String(Int(Self.lease))] + arguments,
                        data: logs + "/data-\(i)", logPath: logs + "/opqd-\(i).log", host: lab?.hosts[i] ?? "127.0.0.1", launcher: lab?.launcher(i) ?? []))
            }
        } catch {
            for n in started { n.killNow() }
            TestPostgres.dropDatabase(database)
            lab?.tearDown()
            throw error
        }
        self.logs = logs
        nodes = started
    }

    /// Stops every process (SIGCONT, SIGTERM, then SIGKILL), drops the database and removes the logs.
    func shutdown() {
        for n in nodes { n.signal(SIGCONT); n.signal(SIGTERM) }
        for n in nodes where n.waitForExit(timeout: 10) == nil { n.killNow() }
        lab?.tearDown()
        TestPostgres.dropDatabase(database)
        try? FileManager.default.removeItem(atPath: logs)
    }

    /// Every instance's pid, port, state and stderr tail, for a failure's message.
    func tails(_ count: Int = 2500) -> String {
        nodes.map { n in
            let state = n.waitForExit(timeout: 0).map(\.description) ?? "running"
            return "--- opqd #\(n.index) pid \(n.pid) \(n.host):\(n.port) (\(state)), stderr tail ---\n\(n.logTail(count))"
        }.joined(separator: "\n")
    }

    /// Problems found so far, by what was checked.
    private let found = Lock<[(what: String, problems: [String])]>([])

    /// Notes `problems` (if any) under `what`, to be recorded by `run` in the test's task:
    /// the checks run on a thread of their own, where Swift Testing cannot tell which test an
    /// issue belongs to.
    func record(_ problems: [String], _ what: String) {
        guard !problems.isEmpty else { return }
        found.withLock { $0.append((what, problems)) }
    }

    /// Runs `checks` on a thread of its own, then records what they found (or threw) as
    /// issues of the calling test, with every instance's stderr tail; always shuts the cluster down.
    func run(_ checks: @escaping @Sendable (TestCluster) throws -> Void, sourceLocation: SourceLocation = #_sourceLocation) async {
        do {
            try await onThread { try checks(self) }
        } catch {
            record(["\(error)"], "thrown")
        }
        // A role change re-executes an instance with the same pid and port (README): a load
        // balancer's target stays valid.
        for n in nodes where Set(n.ports).count > 1 {
            record(["opqd #\(n.index) (pid \(n.pid)) listened on ports \(n.ports) one exec after another; README: same pid and port"], "ports")
        }
        let all = found.withLock { $0 }
        if !all.isEmpty {
            let text = all.map { f in
                let shown = f.problems.prefix(40).joined(separator: "\n  ")
                let more = f.problems.count > 40 ? "\n  … and \(f.problems.count - 40) more" : ""
                return "\(f.what): \(f.problems.count) problem(s):\n  \(shown)\(more)"
            }.joined(separator: "\n")
            Issue.record("\(text)\n\(tails())", sourceLocation: sourceLocation)
        }
        shutdown()
    }

    /// Waits (up to `timeout`) until every one of `among` (default all running ones) holds some
    /// partitions, and each of them answers `GET /v1/cluster` with all the partitions held, by
    /// those instances only, the same way.
    func awaitSpread(among: [ClusterNode]? = nil, timeout: Double = 20) -> Bool {
        waitUntil(timeout: timeout, every: 0.05) {
            let candidates = among ?? nodes.filter(\.isRunning)
            var seen: [String: [Int]]?
            for n in candidates {
                guard let view = n.clusterView() else { return false }
                var held: [String: [Int]] = [:]
                for i in view.answer["instances"] as? [[String: Any]] ?? [] {
                    guard let url = i["url"] as? String, let parts = i["partitions"] as? [Int], !parts.isEmpty else { continue }
                    held[url] = parts.sorted()
                }
                guard held.count == candidates.count, held.values.reduce(0, { $0 + $1.count }) == QueuePartitions.count else { return false }
                if let seen, seen != held { return false }
                seen = held
            }
            return true
        }
    }

    /// Waits (up to `timeout`) until exactly one of `among` (default all running ones) says it
    /// holds the partition of queue `name`, and every other of them names the same instance;
    /// returns it.
    func awaitHolder(of name: String, among: [ClusterNode]? = nil, timeout: Double = 20) -> ClusterNode? {
        let p = QueuePartitions.of(queue: name)
        var found: ClusterNode?
        _ = waitUntil(timeout: timeout, every: 0.05) {
            let candidates = among ?? nodes.filter(\.isRunning)
            var holders: [ClusterNode] = []
            for n in candidates {
                guard let view = n.clusterView() else { return false }
                let named = (view.answer["instances"] as? [[String: Any]] ?? []).filter { ($0["partitions"] as? [Int])?.contains(p) == true }
                guard named.count == 1, let url = named[0]["url"] as? String,
                    let holder = candidates.first(where: { url.hasSuffix(":\($0.port)") })
                else { return false }
                holders.append(holder)
            }
            guard let first = holders.first, holders.allSatisfy({ $0 === first }) else { return false }
            found = first
            return true
        }
        return found
    }

    /// The epoch of the lease of queue `name`'s partition, from `opqd.ownership` (nil if it
    /// cannot be read).
    func epoch(of name: String) -> Int? {
        let scope = QueuePartitions.scope(QueuePartitions.of(queue: name))
        return Int((try? TestPostgres.psql(database, "SELECT epoch FROM opqd.ownership WHERE scope = '\(scope)'")) ?? "")
    }

    /// The events rows of queue `name` per epoch of its partition (`epoch: seq lo–hi (rows)`),
    /// and a problem for every pair of epochs whose rows interleave: an older epoch's row above a
    /// newer epoch's first seq means an owner wrote after it was superseded (or a new owner wrote
    /// below its predecessor's rows).
    func epochRanges(queue name: String) -> (summary: String, problems: [String]) {
        let sql =
            "SELECT coalesce(epoch, -1) || ' ' || min(seq) || ' ' || max(seq) || ' ' || count(*) FROM opqd.events WHERE queue = '\(name)' GROUP BY epoch ORDER BY epoch"
        let text: String
        do { text = try TestPostgres.psql(database, sql) } catch { return ("?", ["cannot read opqd.events per epoch: \(error)"]) }
        let rows = text.split(separator: "\n").map { $0.split(separator: " ").compactMap { Int($0) } }.filter { $0.count == 4 }
        var problems: [String] = []
        for a in rows where a[0] < 0 { problems.append("\(a[3]) events rows without an epoch (seq \(a[1])–\(a[2]))") }
        for a in rows where a[0] >= 0 {
            for b in rows where b[0] > a[0] && a[2] > b[1] {
                problems.append("epoch \(a[0]) wrote seq \(a[2]), above seq \(b[1]), the first of the newer epoch \(b[0])")
            }
        }
        return (rows.map { "epoch \($0[0]): seq \($0[1])–\($0[2]) (\($0[3]) rows)" }.joined(separator: ", "), problems)
    }

    /// For operations that should not exist twice (same name): the epoch and seq of each one's
    /// first event and its state, from `opqd.events` and `opqd.operations`, to tell which owner
    /// committed which copy.
    func describe(duplicates listed: Listing) -> [String] {
        var lines: [String] = []
        for (name, ids) in listed.byName.sorted(by: { $0.key < $1.key }) where ids.count > 1 {
            let numbers = ids.compactMap { id in id.hasPrefix("op-") ? Int(id.dropFirst(3), radix: 16) : nil }
            guard numbers.count == ids.count else { continue }
            let sql =
                "SELECT 'op-' || lpad(to_hex(e.operation), 16, '0') || ': first event seq ' || min(e.seq) || ' epoch ' || min(e.epoch) "
                + "FROM opqd.events e WHERE e.operation IN (\(numbers.map(String.init).joined(separator: ","))) GROUP BY e.operation ORDER BY e.operation"
            let rows = ((try? TestPostgres.psql(database, sql)) ?? "?").split(separator: "\n").joined(separator: "; ")
            lines.append("\(name): \(rows)")
        }
        return lines
    }

    /// Once the partitions are spread over all three, creates queue `name` (limit 8) and answers
    /// the instance that holds it; nil, with the problem recorded, when they do not agree.
    func spreadQueue(_ name: String) throws -> ClusterNode? {
        guard awaitSpread() else {
            record(["the instances did not agree within 20 s on a spread of the partitions over all three"], "start")
            return nil
        }
        try createQueue(name, maxConcurrent: 8, via: nodes[0])
        guard let owner = awaitHolder(of: name) else {
            record(["the instances do not agree on who holds queue \(name)'s partition"], "start")
            return nil
        }
        return owner
    }

    /// Creates a queue through `node`; throws unless 201.
    func createQueue(_ name: String, maxConcurrent: Int, suspended: Bool = false, via node: ClusterNode) throws {
        let r = try node.request(
            "POST", "/v1/queues", json: #"{"name":"\#(name)","maxConcurrentOperationCount":\#(maxConcurrent),"isSuspended":\#(suspended)}"#)
        guard r.status == 201 else { throw Unexpected("creating queue \(name) through opqd #\(node.index)", r) }
    }

    /// Long-polls `GET /v1/queues/{name}/wait` through the nodes in turn until the queue is idle
    /// or `timeout` passes; returns whether it became idle.
    func awaitIdle(_ queue: String, through nodes: [ClusterNode], timeout: Double) -> Bool {
        let deadline = monotonicSeconds() + timeout
        var turn = 0
        while monotonicSeconds() < deadline {
            let node = nodes[turn % nodes.count]
            turn += 1
            let wait = max(1, min(10, Int(deadline - monotonicSeconds())))
            if let r = node.exchange("GET", "/v1/queues/\(queue)/wait?timeout=\(wait)", timeout: Double(wait) + 5).response,
                r.status == 200, r.bool("idle") == true
            {
                return true
            }
            usleep(50_000)
        }
        return false
    }
}
