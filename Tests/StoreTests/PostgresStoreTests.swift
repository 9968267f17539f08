import Foundation
import PostgresStore
import QueueEngine
import SQLiteStore
import Spawning
import Testing

/// Runs `body` with the URL of a fresh database on the test server (OPQD_TEST_POSTGRES_URL),
/// dropped afterwards. Without a server it throws, saying what to set: these tests never pass
/// silently.
func withTestDatabase(_ body: (String) throws -> Void) throws {
    let url = try TestPostgres.createDatabase()
    defer { TestPostgres.dropDatabase(url) }
    try body(url)
}

/// What only the PostgreSQL store has: events numbered in the commit, the instance lock, the
/// schema version, damaged rows, connection failures. The scenarios every store shares (round
/// trip, group commit, retention, idempotency, engine restore) are `StoreConformanceTests`'.
@Suite("PostgresStoreTests: what only the PostgreSQL store has")
struct PostgresStoreTests {
    /// The store numbers events in the commit (one counter for every writer): the engine's seqs
    /// only order them, so an engine that repeats a seq (one that did not restore) still gets
    /// new, contiguous seqs; within one batch the last event of a repeated seq is kept.
    @Test func eventsAreNumberedInTheCommitWhateverSeqTheEngineGaveThem() throws {
        try withTestDatabase { url in
            let store = try PostgresStore(url: url)
            defer { store.close() }
            let numbered = Locked<[[UInt64]?]>([])
            store.onCommittedEvents { batch in numbered.withLock { $0.append(batch?.map(\.seq)) } }
            store.append([.event(event(1, 1)), .event(event(2, 1))], upTo: 1)
            #expect(waitDurable(store, 1))
            let again = event(1, 7, key: .isFinished)
            store.append([.event(event(1, 8)), .event(again), .operation(operationSnapshot(7))], upTo: 2)
            #expect(waitDurable(store, 2))
            var renumbered = again
            renumbered.seq = 3
            #expect(store.recentEvents(limit: 10) == [event(1, 1), event(2, 1), renumbered])
            #expect(numbered.value == [[1, 2], [3]])
            #expect(try store.load().operations.map(\.id.raw) == [7])
            #expect(try store.load().lastSeq == 3)
            #expect(store.lastError == nil)
        }
    }

    /// A sequence behind the stored events (a database edited by hand) is moved past them
    /// rather than wedging the writer on the unique seq.
    @Test func aSequenceBehindTheEventsCatchesUp() throws {
        try withTestDatabase { url in
            let store = try PostgresStore(url: url)
            defer { store.close() }
            store.append([.event(event(1, 1)), .event(event(2, 1))], upTo: 1)
            #expect(waitDurable(store, 1))
            try TestPostgres.psql(url, "SELECT setval('opqd.event_seq', 1)")
            store.append([.event(event(3, 1))], upTo: 2)
            #expect(waitDurable(store, 2))
            #expect(store.recentEvents(limit: 10).map(\.seq) == [1, 2, 3])
            #expect(store.lastError == nil)
        }
    }

    @Test func aSecondStoreOnTheSameDatabaseIsRefusedUntilTheFirstCloses() throws {
        try withTestDatabase { url in
            let first = try PostgresStore(url: url)
            #expect {
                _ = try PostgresStore(url: url)
            } throws: { error in
                guard let e = error as? PostgresStoreError, e.reason == .inUse else { return false }
                return e.description.contains("another opqd instance is using the database")
            }
            first.close()
            // The server ends the closed session (and its lock) on its own time.
            var second: PostgresStore?
            for _ in 0..<100 where second == nil {
                second = try? PostgresStore(url: url)
                if second == nil { usleep(50_000) }
            }
            #expect(second != nil, "the lock stayed held after the first store closed")
            second?.close()
        }
    }

    /// What a cluster follower answers `GET /v1/queues[/{name}]` from: every commit that moves a
    /// queue's revision writes its whole status, and a restart's bump of the revision is written
    /// before any change, with the restarted engine's generation.
    @Test func everyRevisionOfAQueueIsWrittenWithItsStatusAndARestartMovesItOnDurably() throws {
        try withTestDatabase { url in
            let kind = ManualKind()
            let store = try PostgresStore(url: url)
            let engine = QueueEngine(kinds: ["manual": kind], store: store)
            var first = RecoveredState()
            first.generation = 7
            engine.restore(first)
            try engine.createQueue(name: "work", maxConcurrentOperationCount: 1)
            try engine.createQueue(name: "Idle", isSuspended: true)
            try engine.createQueue(name: "gone")
            let a = try engine.addOperationID(to: "work", OperationRequest(kind: "manual"))
            _ = try engine.addOperationID(to: "work", OperationRequest(kind: "manual"))
            let c = try engine.addOperationID(to: "work", OperationRequest(kind: "manual", dependencies: [a]))
            try engine.cancel(c)
            kind.finish(a)  // the next one starts in the same change
            let g = try engine.addOperationID(to: "gone", OperationRequest(kind: "manual"))
            try engine.deleteQueue("gone", force: true)
            kind.finish(g)  // a deleted queue's operation winding down: no row comes back
            #expect(waitDurable(engine))
            let pool = PGReadPool(url: url)
            defer { pool.close() }
            let live = try engine.queue(named: "work")
            #expect(live.counts[.finished] == 2 && live.counts[.executing] == 1 && live.operationCount == 1 && live.generation == 7)
            #expect(try pool.queue(named: "work") == live)
            #expect(try pool.queue(named: "gone") == nil)
            // By name, bytewise, as the engine lists them ("Idle" before "work").
            #expect(try pool.queues() == engine.queues())
            #expect(try pool.queues().map(\.name) == ["Idle", "work"])
            store.close()

            // A restart: past the stored revision, written at once (no change needed) with the new
            // generation; and again at the next restart, past that one.
            var previous = live.revision
            for generation in [UInt64(8), 9] {
                let again = try PostgresStore(url: url)
                defer { again.close() }
                var recovered = try again.load()
                #expect(recovered.queues.first { $0.name == "work" }?.revision == previous)
                recovered.generation = generation
                let restarted = QueueEngine(kinds: ["manual": ManualKind()], store: again)
                restarted.restore(recovered)
                let now = try restarted.queue(named: "work")
                // Past it (the executing operation fails by its kind's rule at the first restart:
                // a change of its own), with the new generation.
                #expect(now.revision > previous && now.generation == generation)
                #expect(waitDurable(restarted))
                #expect(try pool.queue(named: "work") == now)
                #expect(try pool.queues() == restarted.queues())
                previous = now.revision
            }
        }
    }

    @Test func aNewerSchemaIsRefusedAndAnOlderOneIsMigrated() throws {
        try withTestDatabase { url in
            // Version 0: the version table exists, nothing else (as a crash during the first start could leave it).
            try TestPostgres.psql(
                url, "CREATE SCHEMA opqd; CREATE TABLE opqd.schema_version (version integer NOT NULL); INSERT INTO opqd.schema_version VALUES (0)")
            let store = try PostgresStore(url: url)
            store.close()
            #expect(try TestPostgres.psql(url, "SELECT version FROM opqd.schema_version") == "15")
            // Version 2 added the cluster's instance and ownership tables (and the fence function),
            // version 3 the seq's sequence and the writers' commit marks, version 4 the partition
            // fence and the operation id blocks' sequence, version 5 the queues' status columns,
            // version 7 the partition of a kept answer, version 8 the purge's index on
            // finished_at alone (heap-only updates), version 9 the batches across instances and
            // their parts, version 10 flow control (queue rates and fairness weights, operation
            // limits and fairness keys, the limiters), version 11 the limiters' shared budgets
            // (buckets, slots leased per instance, the exchange's functions), version 12 the hosts,
            // version 13 the schedules and the schedule run of an operation, version 14 an
            // operation's admission key, version 15 the queues' history.
            #expect(try TestPostgres.psql(url, "SELECT count(*) FROM information_schema.columns WHERE table_schema = 'opqd' AND table_name = 'queues'") == "16")
            #expect(
                try TestPostgres.psql(url, "SELECT count(*) FROM information_schema.columns WHERE table_schema = 'opqd' AND table_name = 'operations'") == "30")
            #expect(try TestPostgres.psql(url, "SELECT count(*) FROM pg_tables WHERE schemaname = 'opqd'") == "17")
            #expect(try TestPostgres.psql(url, "SELECT count(*) FROM pg_tables WHERE schemaname = 'opqd' AND tablename = 'hosts'") == "1")
            #expect(try TestPostgres.psql(url, "SELECT count(*) FROM pg_tables WHERE schemaname = 'opqd' AND tablename = 'limiters'") == "1")
            #expect(try TestPostgres.psql(url, "SELECT count(*) FROM pg_sequences WHERE schemaname = 'opqd'") == "2")
            #expect(try TestPostgres.psql(url, "SELECT count(*) FROM pg_proc WHERE proname IN ('fence', 'fence_parts')") == "2")
            #expect(
                try TestPostgres.psql(url, "SELECT count(*) FROM pg_proc WHERE proname IN ('limiter_exchange', 'limiter_budget', 'read_limiter', 'clock_ns')")
                    == "4")
            #expect(try TestPostgres.psql(url, "SELECT count(*) FROM pg_indexes WHERE schemaname = 'opqd' AND indexname = 'limiter_slots_by_instance'") == "1")
            #expect(try TestPostgres.psql(url, "SELECT count(*) FROM pg_indexes WHERE schemaname = 'opqd' AND indexname = 'idempotency_by_part'") == "1")

            try TestPostgres.psql(url, "UPDATE opqd.schema_version SET version = 99")
            #expect {
                _ = try PostgresStore(url: url)
            } throws: { error in
                (error as? PostgresStoreError)?.reason == .newerSchema(found: 99, supported: 15)
            }
        }
    }

    @Test func aReadOnlyDatabaseIsRefusedAtStart() throws {
        try withTestDatabase { url in
            let name = String(url.split(separator: "?").first?.split(separator: "/").last ?? "")
            try TestPostgres.psql(url, "ALTER DATABASE \(name) SET default_transaction_read_only = on")
            #expect {
                _ = try PostgresStore(url: url)
            } throws: { error in
                (error as? PostgresStoreError)?.detail.contains("read-only") == true
            }
        }
    }

    @Test func anOpqdSchemaWithoutAVersionIsRefused() throws {
        try withTestDatabase { url in
            try TestPostgres.psql(url, "CREATE SCHEMA opqd; CREATE TABLE opqd.operations (id int)")
            #expect {
                _ = try PostgresStore(url: url)
            } throws: { error in
                (error as? PostgresStoreError)?.reason == .foreignSchema
            }
            // Nothing was created by the refused start.
            #expect(try TestPostgres.psql(url, "SELECT count(*) FROM pg_tables WHERE schemaname = 'opqd'") == "1")
        }
    }

    @Test func anUnreachableServerFailsFastWithoutThePassword() throws {
        let started = Date()
        #expect {
            _ = try PostgresStore(url: "postgres://opqd:s3cret@127.0.0.1:1/opqd", connectTimeoutSeconds: 2)
        } throws: { error in
            guard let e = error as? PostgresStoreError, e.reason == .cannotConnect else { return false }
            return !e.description.contains("s3cret") && e.description.contains("opqd:***@127.0.0.1:1")
        }
        #expect(Date().timeIntervalSince(started) < 5)
        #expect(PostgresStore.redact("postgresql://u:p@h/db?sslmode=require&password=x") == "postgresql://u:***@h/db?sslmode=require&password=***")
    }

    @Test(arguments: [
        ("attempt", "-1"), ("priority", "99"), ("state", "'gone'"), ("dependencies", "'{-5}'"), ("revision", "-1"),
        ("id", "-3"), ("spec", "'{not json'"), ("retry", "'{\"maxAttempts\":1e300,\"backoff\":1,\"multiplier\":1}'"),
        ("executed_seconds", "'NaN'"), ("timeout", "'-Infinity'"), ("admission", "'singleton '"), ("admission", "'debounce 1'"),
    ])
    func aDamagedOperationRowFailsTheLoadNamingIt(column: String, value: String) throws {
        try withTestDatabase { url in
            let store = try PostgresStore(url: url)
            store.append([.queue(queueSnapshot("q")), .operation(operationSnapshot(1))], upTo: 1)
            #expect(waitDurable(store, 1))
            store.close()
            try TestPostgres.psql(url, "UPDATE opqd.operations SET \(column) = \(value)")
            let reopened = try PostgresStore(url: url)
            defer { reopened.close() }
            #expect {
                _ = try reopened.load()
            } throws: { error in
                guard let e = error as? PostgresStoreError, e.reason == .corrupt else { return false }
                return e.detail.contains("operations row")
            }
        }
    }

    @Test(arguments: [
        ("max_concurrent", "0"), ("max_concurrent", "-7"), ("revision", "-1"), ("effective_max", "9223372036854775807"),
        ("generation", "-1"), ("operation_count", "-5"), ("count_finished", "-1"),
    ])
    func aDamagedQueueRowFailsTheLoad(column: String, value: String) throws {
        try withTestDatabase { url in
            let store = try PostgresStore(url: url)
            store.append([.queue(queueSnapshot("q"))], upTo: 1)
            #expect(waitDurable(store, 1))
            store.close()
            try TestPostgres.psql(url, "UPDATE opqd.queues SET \(column) = \(value)")
            let reopened = try PostgresStore(url: url)
            defer { reopened.close() }
            if column == "effective_max" {
                // Any integer is a limit the engine can hold (it clamps it); no trap on the way.
                #expect(try reopened.load().queues.count == 1)
                return
            }
            #expect {
                _ = try reopened.load()
            } throws: { error in
                (error as? PostgresStoreError)?.reason == .corrupt && (error as? PostgresStoreError)?.detail.contains("queues row q") == true
            }
            // A follower's read of it fails the same way (a generic 500, not a trap or a made-up count).
            let pool = PGReadPool(url: url)
            defer { pool.close() }
            #expect(throws: PGReadDamaged.self) { _ = try pool.queue(named: "q") }
            #expect(throws: PGReadDamaged.self) { _ = try pool.queues() }
        }
    }

    @Test func eventsWithImpossibleValuesAreLeftOutOfTheFeed() throws {
        try withTestDatabase { url in
            let store = try PostgresStore(url: url)
            store.append([.event(event(1, 1)), .event(event(2, 1)), .event(event(3, 1)), .event(event(4, 1))], upTo: 1)
            #expect(waitDurable(store, 1))
            store.close()
            try TestPostgres.psql(
                url,
                "UPDATE opqd.events SET seq = -5 WHERE seq = 1; UPDATE opqd.events SET key = 'bogus' WHERE seq = 2; UPDATE opqd.events SET new = '{' WHERE seq = 3"
            )
            let reopened = try PostgresStore(url: url)
            defer { reopened.close() }
            #expect(reopened.recentEvents(limit: 10).map(\.seq) == [4])
            let window = try #require(reopened.eventWindow(queue: "q", operation: nil, after: 0, through: 10, limit: 10))
            #expect(window.events.map(\.seq) == [4])
            #expect(window.rows == 3 && window.lastSeq == 4)
        }
    }

    @Test func aBatchTheServerRefusesIsRolledBackAndRetriedAndNothingIsDurableMeanwhile() throws {
        try withTestDatabase { url in
            let store = try PostgresStore(url: url)
            defer { store.close() }
            store.append([.queue(queueSnapshot("ok"))], upTo: 1)
            #expect(waitDurable(store, 1))
            // A statement error mid-pipeline: the rest is skipped, the transaction must be rolled back.
            try TestPostgres.psql(url, "ALTER TABLE opqd.queues ADD CONSTRAINT refuse_bad CHECK (name <> 'bad')")
            store.append([.operation(operationSnapshot(1, queue: "bad")), .queue(queueSnapshot("bad")), .event(event(1, 1))], upTo: 2)
            #expect(!waitDurable(store, 2, timeout: 1), "reported durable though the server refused the batch")
            #expect(store.lastError?.reason == .io)
            #expect(try TestPostgres.psql(url, "SELECT count(*) FROM opqd.operations") == "0")
            try TestPostgres.psql(url, "ALTER TABLE opqd.queues DROP CONSTRAINT refuse_bad")
            #expect(waitDurable(store, 2, timeout: 10))
            #expect(waitUntil(timeout: 5) { store.lastError == nil })
            let state = try store.load()
            #expect(state.queues.map(\.name) == ["bad", "ok"])
            #expect(state.operations.map(\.id.raw) == [1])
            #expect(state.lastSeq == 1)
        }
    }

    @Test func aBrokenConnectionIsReplacedAndNothingIsReportedDurableMeanwhile() throws {
        try withTestDatabase { url in
            let server = try TestPostgres.requireServer()
            let name = String(url.split(separator: "/").last ?? "")
            let store = try PostgresStore(url: url)
            defer { store.close() }
            store.append([.queue(queueSnapshot("before"))], upTo: 1)
            #expect(waitDurable(store, 1))

            // The database refuses connections and its sessions are ended: the writer loses
            // its connection (and lock) and cannot get them back yet.
            try TestPostgres.psql(server, "ALTER DATABASE \(name) ALLOW_CONNECTIONS false")
            try TestPostgres.psql(server, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '\(name)'")
            store.append([.queue(queueSnapshot("during"))], upTo: 2)
            #expect(!waitDurable(store, 2, timeout: 1.5), "reported durable while the database was unreachable")
            #expect(store.lastError != nil)

            try TestPostgres.psql(server, "ALTER DATABASE \(name) ALLOW_CONNECTIONS true")
            #expect(waitDurable(store, 2, timeout: 20))
            #expect(waitUntil(timeout: 10) { store.lastError == nil })
            #expect(store.stats.failures > 0)
            #expect(try store.load().queues.map(\.name) == ["before", "during"])
        }
    }
}

/// A batch whose COMMIT reached the server but whose answer never came back (the connection
/// broke in between) is not committed a second time: its events keep the seqs they got.
/// (In the `PostgresStoreTests` suite: scripts/test.sh runs it apart, with the server.)
extension PostgresStoreTests {
    /// A TCP relay to the server that, once the file `arm` exists, passes the next message that
    /// holds a COMMIT (as text, or as the writer's prepared `opqd_write_commit`) to the server, swallows everything the server answers after it, and closes
    /// the connection half a second later (the file is removed: one cut).
    static let relay = """
        import os, socket, sys, threading, time
        host, port, arm = sys.argv[1], int(sys.argv[2]), sys.argv[3]
        lsock = socket.socket(); lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        lsock.bind(('127.0.0.1', 0)); lsock.listen(16)
        print(lsock.getsockname()[1], flush=True)
        guard = threading.Lock()
        def serve(c):
            u = socket.create_connection((host, port))
            cut = threading.Event()
            def down():
                try:
                    while True:
                        d = u.recv(65536)
                        if not d: break
                        if not cut.is_set(): c.sendall(d)
                except OSError: pass
            threading.Thread(target=down, daemon=True).start()
            try:
                while True:
                    d = c.recv(65536)
                    if not d: break
                    with guard:
                        fire = (b'COMMIT' in d or b'opqd_write_commit' in d) and os.path.exists(arm)
                        if fire: os.remove(arm)
                    if fire: cut.set()
                    u.sendall(d)
                    if fire:
                        time.sleep(0.5)
                        break
            except OSError: pass
            for s in (c, u):
                try: s.shutdown(socket.SHUT_RDWR)
                except OSError: pass
                s.close()
        while True:
            conn, _ = lsock.accept()
            threading.Thread(target=serve, args=(conn,), daemon=True).start()
        """

    @Test func aBatchWhoseCommitAnswerWasLostIsNotNumberedTwice() throws {
        try withTestDatabase { url in
            guard let at = url.range(of: "@127.0.0.1:"), let slash = url[at.upperBound...].firstIndex(of: "/"),
                let port = Int(url[at.upperBound..<slash])
            else { throw TestClientError("the test server's URL is not postgres://…@127.0.0.1:PORT/…: \(url)") }
            let arm = NSTemporaryDirectory() + "opqd-relay-arm-\(UInt64.random(in: 0...UInt64.max))"
            var request = SpawnRequest(["/usr/bin/python3", "-c", Self.relay, "127.0.0.1", String(port), arm])
            request.stdout = .pipe
            let relay = try ChildProcess(request)
            defer {
                relay.killNow()
                try? FileManager.default.removeItem(atPath: arm)
            }
            let line = relay.readLine(timeout: 10) ?? ""
            guard let relayPort = Int(line) else { throw TestClientError("the relay did not start: \(line)") }
            let relayed = url.replacingCharacters(in: at.upperBound..<slash, with: String(relayPort))

            let store = try PostgresStore(url: relayed)
            defer { store.close() }
            let numbered = Locked<[[UInt64]?]>([])
            store.onCommittedEvents { batch in numbered.withLock { $0.append(batch?.map(\.seq)) } }
            store.append([.event(event(1, 1)), .event(event(2, 1))], upTo: 1)
            #expect(waitDurable(store, 1))

            #expect(FileManager.default.createFile(atPath: arm, contents: Data()))
            store.append([.event(event(3, 1)), .event(event(4, 1))], upTo: 2)
            #expect(waitDurable(store, 2, timeout: 20))
            #expect(!FileManager.default.fileExists(atPath: arm), "the relay never cut a COMMIT's answer")
            #expect(store.stats.failures > 0)
            #expect(store.recentEvents(limit: 10).map(\.seq) == [1, 2, 3, 4])
            #expect(try TestPostgres.psql(url, "SELECT count(*) FROM opqd.events") == "4")
            // The lost commit's events are not known to the writer: it says so, to be read back.
            #expect(numbered.value.count == 2 && numbered.value.first == [1, 2] && numbered.value.last == .some(nil))
        }
    }

    /// A batch across instances (`PostgresStore+Batches`): its outcome is the row that wins.
    @Test func aBatchIsCommittedOnceOrWrittenOffAndItsPartsCountAsUnfinished() throws {
        try withTestDatabase { url in
            let store = try PostgresStore(url: url)
            defer { store.close() }
            let ids = [OperationID(raw: 1 << 40 | 1), OperationID(raw: 1 << 40 | 2)]
            func decision(_ id: String, idem: String? = nil, fences: [(instance: String, scopes: [String], epochs: [Int64])] = []) -> BatchDecision {
                BatchDecision(
                    id: id, idem: idem, bodyHash: idem.map { _ in [1, 2, 3] }, body: Array(#"{"operations":[]}"#.utf8), ids: ids,
                    parts: [(3, [ids[0]]), (5, [ids[1]])], fences: fences)
            }
            // Committed, and the same decision again (a lost answer) finds its own row.
            #expect(try store.decideBatch(decision("aa")) == .committed)
            #expect(try store.decideBatch(decision("aa")) == .committed)
            #expect(try store.committedBatch("aa")?.ids == ids)
            #expect(try store.pendingParts(of: "aa").sorted() == [3, 5])
            #expect(try store.pendingBatches(parts: [5, 9]) == ["aa"])
            // Its operations exist for the others and are not finished, until its parts are added.
            #expect(try store.operationStates(ids).finished == [ids[0]: false, ids[1]: false])
            #expect(try store.writeOffBatch("aa"), "a committed batch cannot be written off")
            // A part goes in the commit that adds it (`StoreRecord.batchPartAdded`).
            store.append([.operation(operationSnapshot(ids[0].raw)), .batchPartAdded(batch: "aa", part: 3)], upTo: 1)
            #expect(waitDurable(store, 1))
            #expect(try store.pendingParts(of: "aa") == [5])
            #expect(try store.operationStates(ids).finished[ids[1]] == false)
            store.append([.operation(operationSnapshot(ids[1].raw)), .batchPartAdded(batch: "aa", part: 5)], upTo: 2)
            #expect(waitDurable(store, 2))
            #expect(try store.pendingBatches(parts: [3, 5]).isEmpty)
            #expect(try store.operationStates(ids).finished.count == 2, "the operations' own rows answer now")
            // Written off first: the decision finds it aborted, and writes no part.
            #expect(try !store.writeOffBatch("bb"))
            #expect(try store.decideBatch(decision("bb")) == .aborted)
            #expect(try store.committedBatch("bb") == nil)
            #expect(try store.pendingParts(of: "bb").isEmpty)
            // An owner that does not hold the partitions it named: nothing.
            #expect(try store.decideBatch(decision("cc", fences: [("nobody", ["p3"], [1])])) == .fenced)
            #expect(try store.committedBatch("cc") == nil)
            // One committed batch per Idempotency-Key.
            #expect(try store.decideBatch(decision("dd", idem: "k")) == .committed)
            #expect(try store.decideBatch(decision("ee", idem: "k")) == .sameKey(id: "dd"))
            #expect(try store.batch(withKey: "k")?.id == "dd")
            #expect(try store.committedBatch("ee") == nil)
        }
    }
}
