import Foundation
import Locking
import OpqdApp
import QueueAPI
import QueueTesting
import Spawning
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// The store an end-to-end test runs the real binary on: the default SQLite in `--data`, or a
/// fresh PostgreSQL database (`--store postgres://…`, on OPQD_TEST_POSTGRES_URL's server).
enum StoreChoice: String, CaseIterable, Sendable, CustomTestStringConvertible {
    case sqlite, postgres
    var testDescription: String { rawValue }

    /// The arguments that select it, and what removes it afterwards.
    func prepare() throws -> (arguments: [String], remove: @Sendable () -> Void) {
        switch self {
        case .sqlite: return ([], {})
        case .postgres:
            let url = try TestPostgres.createDatabase()
            // A restart after kill -9 follows until the dead owner's lease runs out: 1 s.
            return (["--store", url, "--lease", "1"], { TestPostgres.dropDatabase(url) })
        }
    }

    /// Waits until `server` serves the queues itself: at once with SQLite; with PostgreSQL once
    /// it took the ownership over (after the killed one's lease): with `--ownership one` the
    /// owner's lease, with partitions every partition (the killed instance's heartbeat counts it
    /// as live for a lease more, so its share of the partitions comes after the rest).
    /// Throws after 15 s.
    static func awaitOwner(_ server: ServerProcess) throws {
        let deadline = Date().addingTimeInterval(15)
        while Date() < deadline {
            if let view = try? server.request("GET", "/v1/cluster"), view.status == 200 {
                if view.string("mode") == "single" { return }
                let me = view.objects("instances").first { $0["self"] as? Bool == true }
                if let total = view.int("partitions") {
                    if (me?["partitions"] as? [Any])?.count == total { return }
                } else if me?["owner"] as? Bool == true {
                    return
                }
            }
            Thread.sleep(forTimeInterval: 0.05)
        }
        throw Unexpected("the restarted opqd did not take the queues over within 15 s")
    }
}

/// The real `opqd` binary on `--store postgres://…`: what it does on SQLite, it does here
/// (the kill -9 tests of CrashRecoveryTests and BatchDurabilityTests run on both stores);
/// what only a server has (one instance per database, the schema version, the server going
/// away) is checked here.
@Suite("PostgreSQL store, end to end (the real binary)")
struct PostgresEndToEndTests {
    /// Runs the binary until it exits (it must, within `timeout`); its exit code and log.
    static func runToExit(_ binary: String, _ arguments: [String], timeout: Double = 20) throws -> (code: Int32?, log: String, seconds: Double) {
        let log = NSTemporaryDirectory() + "opqd-pg-refusal-\(UInt64.random(in: 0...UInt64.max)).log"
        defer { try? FileManager.default.removeItem(atPath: log) }
        var request = SpawnRequest([binary, "--host", "127.0.0.1", "--port", "0"] + arguments)
        request.environment = ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("OPQD_") }.map { "\($0.key)=\($0.value)" }
        request.stdout = .null
        request.stderr = .file(log, append: false)
        let started = Date()
        let child = try ChildProcess(request)
        guard let status = child.wait(timeout: timeout) else {
            child.killNow()
            throw TestClientError("opqd \(arguments) was still running after \(timeout) s")
        }
        let text = (try? String(contentsOfFile: log, encoding: .utf8)) ?? ""
        return (Spawner.decode(status).exitCode, text, Date().timeIntervalSince(started))
    }

    @Test("--store and OPQD_STORE take postgres:// and postgresql:// URLs, and nothing else new")
    func configuration() throws {
        let url = "postgresql://u:p@db.example:5432/opqd?sslmode=require"
        #expect(try OpqdConfiguration.parse(arguments: [], environment: ["OPQD_STORE": url]).store == url)
        #expect(try OpqdConfiguration.parse(arguments: ["--store", "postgres://h/db"], environment: ["OPQD_STORE": "memory"]).store == "postgres://h/db")
        #expect(try OpqdConfiguration.parse(arguments: ["--store", "sqlite"], environment: [:]).store == "sqlite")
        for bad in ["mysql://h/db", "postgres:/h", "POSTGRES://h/db", ""] {
            #expect(throws: (any Error).self, "\(bad)") { try OpqdConfiguration.parse(arguments: ["--store", bad], environment: [:]) }
        }
    }

    @Test("create, run and finish an operation, then find it again after a restart")
    func roundTrip() async throws {
        let binary = try OpqdBinary.locate()
        let url = try TestPostgres.createDatabase()
        let logs = try makeTemporaryDirectory(prefix: "opqd-pg-logs")
        defer {
            TestPostgres.dropDatabase(url)
            try? FileManager.default.removeItem(atPath: logs)
        }
        try await onThread {
            let server = try ServerProcess(binary: binary, data: logs + "/unused", logPath: logs + "/opqd-0.log", extraArguments: ["--store", url])
            let ready = try server.request("GET", "/readyz").expecting(200)
            #expect(ready.string("store") == "postgres")
            _ = try server.request("POST", "/v1/queues", json: #"{"name":"pg"}"#).expecting(201)
            let created = try server.request("POST", "/v1/queues/pg/operations", json: #"{"kind":"delay","name":"nul\u0000name","spec":{"seconds":0.05}}"#)
                .expecting(201)
            let id = try #require(created.string("id"))
            let finished = try server.request("GET", "/v1/operations/\(id)/wait?timeout=10").expecting(200)
            #expect(finished.string("state") == "finished")
            #expect(finished.string("outcome") == "succeeded")
            let events = try server.request("GET", "/v1/events?after=0").expecting(200).objects("events")
            #expect(events.count >= 4)
            server.signal(SIGTERM)
            #expect(server.waitForExit(timeout: 10) == .exited(0))

            let again = try ServerProcess(binary: binary, data: logs + "/unused", logPath: logs + "/opqd-1.log", extraArguments: ["--store", url])
            defer {
                again.signal(SIGTERM)
                _ = again.waitForExit(timeout: 10)
            }
            let back = try again.request("GET", "/v1/operations/\(id)").expecting(200)
            #expect(back.string("state") == "finished")
            #expect(back.string("name") == "nul\u{0}name")
            let feed = try again.request("GET", "/v1/events?after=0").expecting(200).objects("events")
            #expect(feed.compactMap { $0["seq"] as? Int } == events.compactMap { $0["seq"] as? Int })
            #expect(!FileManager.default.fileExists(atPath: logs + "/unused/opqd.sqlite"), "--store postgres must not touch --data")
        }
    }

    @Test("a second opqd on the same database follows the first: it forwards changes, serves the feed, and takes over after a kill -9")
    func secondInstanceFollows() async throws {
        let binary = try OpqdBinary.locate()
        let url = try TestPostgres.createDatabase()
        let logs = try makeTemporaryDirectory(prefix: "opqd-pg-logs")
        defer {
            TestPostgres.dropDatabase(url)
            try? FileManager.default.removeItem(atPath: logs)
        }
        try await onThread {
            // The one-owner cluster (`--ownership one`; ClusterTests run the partitioned default).
            let lease = ["--store", url, "--ownership", "one", "--lease", "1"]
            let first = try ServerProcess(binary: binary, data: logs + "/a", logPath: logs + "/first.log", extraArguments: lease)
            let second = try ServerProcess(binary: binary, data: logs + "/b", logPath: logs + "/second.log", extraArguments: lease)
            defer {
                second.signal(SIGTERM)
                _ = second.waitForExit(timeout: 10)
            }
            let cluster = try second.request("GET", "/v1/cluster").expecting(200)
            #expect(cluster.string("mode") == "cluster")
            let instances = cluster.objects("instances")
            #expect(instances.count == 2)
            #expect(instances.filter { $0["owner"] as? Bool == true }.count == 1)
            #expect(instances.first { $0["self"] as? Bool == true }?["owner"] as? Bool == false, "the second one follows")
            // A change through the follower is the owner's, answered after its commit.
            _ = try second.request("POST", "/v1/queues", json: #"{"name":"still","maxConcurrentOperationCount":1}"#).expecting(201)
            let created = try second.request("POST", "/v1/queues/still/operations", json: #"{"kind":"delay","spec":{"seconds":0.05}}"#).expecting(201)
            let id = try #require(created.string("id"))
            _ = try first.request("GET", "/v1/operations/\(id)").expecting(200)
            let done = try second.request("GET", "/v1/operations/\(id)/wait?timeout=10").expecting(200)
            #expect(done.string("state") == "finished")
            // The follower's own feed, read back from PostgreSQL, is the owner's.
            let deadline = Date().addingTimeInterval(5)
            var theirs: [Int] = [], ours: [Int] = []
            repeat {
                theirs = try first.request("GET", "/v1/events?after=0").expecting(200).objects("events").compactMap { $0["seq"] as? Int }
                ours = try second.request("GET", "/v1/events?after=0").expecting(200).objects("events").compactMap { $0["seq"] as? Int }
            } while ours != theirs && Date() < deadline
            #expect(!ours.isEmpty && ours == theirs)

            first.signal(SIGKILL)
            _ = first.waitForExit(timeout: 10)
            // The lease (1 s) runs out, the follower takes over and serves the queue itself.
            let takeover = Date().addingTimeInterval(10)
            var owner = false
            while !owner && Date() < takeover {
                Thread.sleep(forTimeInterval: 0.1)
                let view = try? second.request("GET", "/v1/cluster")
                owner = view?.status == 200 && view?.objects("instances").first { $0["self"] as? Bool == true }?["owner"] as? Bool == true
            }
            #expect(owner, "the follower took over")
            _ = try second.request("GET", "/v1/queues/still").expecting(200)
            let after = try second.request("POST", "/v1/queues/still/operations", json: #"{"kind":"delay","spec":{"seconds":0}}"#).expecting(201)
            let next = try #require(after.string("id"))
            #expect(try second.request("GET", "/v1/operations/\(next)/wait?timeout=10").expecting(200).string("state") == "finished")
        }
    }

    @Test("the owner's feed shows a change as soon as it is answered, numbered as PostgreSQL numbered it; a follower's feed is the same")
    func feedSeqsComeFromTheCommit() async throws {
        let binary = try OpqdBinary.locate()
        let url = try TestPostgres.createDatabase()
        let logs = try makeTemporaryDirectory(prefix: "opqd-pg-logs")
        defer {
            TestPostgres.dropDatabase(url)
            try? FileManager.default.removeItem(atPath: logs)
        }
        try await onThread {
            // The one-owner cluster (`--ownership one`; ClusterTests run the partitioned default).
            let lease = ["--store", url, "--ownership", "one", "--lease", "1"]
            let owner = try ServerProcess(binary: binary, data: logs + "/a", logPath: logs + "/owner.log", extraArguments: lease)
            let follower = try ServerProcess(binary: binary, data: logs + "/b", logPath: logs + "/follower.log", extraArguments: lease)
            defer {
                follower.signal(SIGTERM)
                _ = follower.waitForExit(timeout: 10)
            }
            try StoreChoice.awaitOwner(owner)
            _ = try owner.request("POST", "/v1/queues", json: #"{"name":"feed","maxConcurrentOperationCount":2}"#).expecting(201)
            var newest = 0
            for i in 0..<40 {
                let created = try owner.request("POST", "/v1/queues/feed/operations", json: #"{"kind":"delay","spec":{"seconds":0.01}}"#)
                    .expecting(201)
                let id = try #require(created.string("id"))
                // Without waiting: what was answered is in the feed already.
                let page = try owner.request("GET", "/v1/events?after=\(newest)").expecting(200).objects("events")
                #expect(page.contains { $0["operation"] as? String == id }, "operation \(i) (\(id)) missing from the owner's feed after its 201")
                newest = page.compactMap { $0["seq"] as? Int }.max() ?? newest
            }
            for op in try owner.request("GET", "/v1/queues/feed/operations?limit=100").expecting(200).objects("operations") {
                if let id = op["id"] as? String { _ = try owner.request("GET", "/v1/operations/\(id)/wait?timeout=10").expecting(200) }
            }
            // Every seq shown is the stored one, once, in order; the follower shows the same events.
            let stored = try TestPostgres.psql(url, "SELECT string_agg(seq::text, ',' ORDER BY seq) FROM opqd.events")
            let deadline = Date().addingTimeInterval(5)
            var theirs: [[String: Any]] = [], ours: [[String: Any]] = []
            repeat {
                theirs = try owner.request("GET", "/v1/events?after=0&limit=1000").expecting(200).objects("events")
                ours = try follower.request("GET", "/v1/events?after=0&limit=1000").expecting(200).objects("events")
            } while (ours.count != theirs.count || theirs.map { "\($0["seq"] ?? "")" }.joined(separator: ",") != stored) && Date() < deadline
            let seqs = theirs.compactMap { $0["seq"] as? Int }
            #expect(seqs.map(String.init).joined(separator: ",") == stored)
            #expect(seqs == Array(seqs.sorted()) && Set(seqs).count == seqs.count)
            #expect(ours.count == theirs.count)
            func text(_ e: [String: Any]) -> String {
                String(decoding: (try? JSONSerialization.data(withJSONObject: e, options: .sortedKeys)) ?? Data(), as: UTF8.self)
            }
            #expect(ours.map(text) == theirs.map(text))
        }
    }

    @Test("a database with a newer opqd schema, or an unreachable server, stops the start with a clear message")
    func refusalsAtStart() async throws {
        let binary = try OpqdBinary.locate()
        let url = try TestPostgres.createDatabase()
        defer { TestPostgres.dropDatabase(url) }
        try await onThread {
            let data = NSTemporaryDirectory() + "opqd-pg-unused-\(UInt64.random(in: 0...UInt64.max))"
            defer { try? FileManager.default.removeItem(atPath: data) }
            // As a newer opqd would leave it.
            try TestPostgres.psql(
                url, "CREATE SCHEMA opqd; CREATE TABLE opqd.schema_version (version integer NOT NULL); INSERT INTO opqd.schema_version VALUES (42)")
            let newer = try Self.runToExit(binary, ["--data", data, "--store", url])
            #expect(newer.code == 1)
            #expect(newer.log.contains("has opqd schema version 42, but this opqd understands up to "), "\(newer.log)")
            #expect(try TestPostgres.psql(url, "SELECT version FROM opqd.schema_version") == "42")

            let unreachable = try Self.runToExit(binary, ["--data", data, "--store", "postgres://opqd:hunter2@127.0.0.1:1/opqd"])
            #expect(unreachable.code == 1)
            #expect(unreachable.log.contains("cannot connect to PostgreSQL at postgres://opqd:***@127.0.0.1:1/opqd"), "\(unreachable.log)")
            #expect(!unreachable.log.contains("hunter2"))
            #expect(unreachable.seconds < 10)
        }
    }

    @Test("while the database is unreachable, answers wait and /readyz is 503; then the change is committed and answered")
    func answersWaitForTheDatabase() async throws {
        let binary = try OpqdBinary.locate()
        let server = try TestPostgres.requireServer()
        let url = try TestPostgres.createDatabase()
        let name = String(url.split(separator: "?").first?.split(separator: "/").last ?? "")
        let logs = try makeTemporaryDirectory(prefix: "opqd-pg-logs")
        defer {
            _ = try? TestPostgres.psql(server, "ALTER DATABASE \(name) ALLOW_CONNECTIONS true")
            TestPostgres.dropDatabase(url)
            try? FileManager.default.removeItem(atPath: logs)
        }
        try await onThread {
            // Lease 2 s: the restart after the kill -9 below waits for the dead owner's lease.
            let opqd = try ServerProcess(
                binary: binary, data: logs + "/unused", logPath: logs + "/opqd.log", extraArguments: ["--store", url, "--lease", "2"])
            defer {
                opqd.signal(SIGTERM)
                _ = opqd.waitForExit(timeout: 15)
            }
            _ = try opqd.request("POST", "/v1/queues", json: #"{"name":"q","isSuspended":true}"#).expecting(201)
            try TestPostgres.psql(server, "ALTER DATABASE \(name) ALLOW_CONNECTIONS false")
            try TestPostgres.psql(server, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '\(name)'")

            // The idle writer finds its connection gone within a few seconds.
            var notReady: TestResponse?
            for _ in 0..<100 where notReady == nil {
                let r = try opqd.request("GET", "/readyz")
                if r.status == 503 { notReady = r } else { usleep(100_000) }
            }
            #expect(notReady != nil, "/readyz stayed 200 with the database unreachable")
            // Readiness is open to anyone: it says why, but not where the database is.
            #expect(notReady?.string("detail")?.contains("unreachable") == true, "\(notReady.map(\.text) ?? "")")
            #expect(notReady?.text.contains(name) == false)
            #expect(notReady?.text.contains("127.0.0.1") == false)
            let pending = Lock<TestResponse?>(nil)
            let sender = Thread {
                let r = try? opqd.request("POST", "/v1/queues/q/operations", json: #"{"kind":"delay","spec":{"seconds":1}}"#, timeout: 60)
                pending.withLock { $0 = r }
            }
            sender.start()
            usleep(1_500_000)
            #expect(pending.withLock { $0 } == nil, "a create was answered while the database was unreachable")

            try TestPostgres.psql(server, "ALTER DATABASE \(name) ALLOW_CONNECTIONS true")
            #expect(waitUntil(timeout: 30, every: 0.05) { pending.withLock { $0 } != nil })
            let created = try #require(pending.withLock { $0 })
            #expect(created.status == 201, "\(created)")
            let id = try #require(created.string("id"))
            #expect(waitUntil(timeout: 10, every: 0.1) { (try? opqd.request("GET", "/readyz").status) == 200 })

            // Acknowledged means committed: it is there after a kill -9.
            opqd.signal(SIGKILL)
            _ = opqd.waitForExit(timeout: 10)
            let again = try ServerProcess(
                binary: binary, data: logs + "/unused", logPath: logs + "/opqd-1.log", extraArguments: ["--store", url, "--lease", "2"])
            defer {
                again.signal(SIGTERM)
                _ = again.waitForExit(timeout: 10)
            }
            // It follows until the killed owner's lease runs out, then takes the queues over.
            #expect(waitUntil(timeout: 15, every: 0.1) { (try? again.request("GET", "/v1/operations/\(id)").status) == 200 })
        }
    }
}
