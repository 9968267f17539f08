import Foundation
import PostgresStore
import QueueEngine
import Testing

/// A host name whose partition, were it a queue's, is not `p`: a breaker event names its host
/// where an operation's names its queue, and must not be fenced by that partition.
func hostOutside(partition p: Int) -> String {
    var i = 0
    while QueuePartitions.of(queue: "h\(i).example:443") == p { i += 1 }
    return "h\(i).example:443"
}

/// Hosts on PostgreSQL beyond the round trip every store shares
/// (`StoreConformanceTests.hostsSurviveCloseAndReopen`): the migration from schema 11, damaged
/// rows, a follower's read, and hosts in a cluster, which belong to no partition.
extension PostgresStoreTests {
    @Test func aDatabaseOfSchema11IsMigratedAndKeepsHosts() throws {
        try withTestDatabase { url in
            let store = try PostgresStore(url: url)
            store.append([.queue(queueSnapshot("q")), .operation(operationSnapshot(1)), .event(event(1, 1))], upTo: 1)
            #expect(waitDurable(store, 1))
            store.close()
            // The database as schema 11 left it: no hosts (and nothing of versions 13 to 15).
            try TestPostgres.psql(
                url,
                """
                DROP TABLE opqd.history; DROP TABLE opqd.schedules;
                ALTER TABLE opqd.operations DROP COLUMN schedule_name, DROP COLUMN schedule_nominal, DROP COLUMN admission;
                DROP TABLE opqd.hosts; UPDATE opqd.schema_version SET version = 11
                """)
            let migrated = try PostgresStore(url: url)
            let state = try migrated.load()
            #expect(state.hosts.isEmpty && state.queues.map(\.name) == ["q"] && state.operations.map(\.id.raw) == [1] && state.lastSeq == 1)
            #expect(try TestPostgres.psql(url, "SELECT version FROM opqd.schema_version") == "15")
            let h = HostSnapshot(
                host: "a:80", state: .open, consecutiveFailures: 5, openedAt: t0, until: t0.adding(seconds: 5),
                lastError: .object([("type", .string("timeout"))]), reopenings: 1, revision: 2)
            migrated.append([.host(h)], upTo: 2)
            #expect(waitDurable(migrated, 2))
            migrated.close()
            let again = try PostgresStore(url: url)
            defer { again.close() }
            #expect(try again.load().hosts == [h])
        }
    }

    @Test(arguments: [
        ("'nohost', 'open', 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, 1", "host"),
        ("'a:80', 'ajar', 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, 1", "state"),
        ("'a:80', 'open', -1, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, 1", "consecutive_failures"),
        ("'a:80', 'open', 0, NULL, NULL, NULL, 'x', NULL, NULL, NULL, 0, 1", "last_error"),
        ("'a:80', 'open', 0, NULL, NULL, NULL, '[1]', NULL, NULL, NULL, 0, 1", "last_error"),
        ("'a:80', 'open', 0, NULL, NULL, NULL, NULL, 'shut', NULL, NULL, 0, 1", "manual_breaker"),
        ("'a:80', 'open', 0, NULL, NULL, NULL, NULL, NULL, NULL, 'why', 0, 1", "manual_breaker"),
        ("'a:80', 'open', 0, NULL, NULL, NULL, NULL, 'open', NULL, repeat('r', 513), 0, 1", "manual_reason"),
        ("'a:80', 'open', 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 63, 1", "reopenings"),
        ("'a:80', 'open', 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, -1, 1", "reopenings"),
        ("'a:80', 'open', 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, -1", "revision"),
    ])
    func aDamagedHostRowFailsTheLoadTheTakingOfPartitionsAndAFollowersRead(values: String, column: String) throws {
        try withTestDatabase { url in
            let store = try PostgresStore(url: url)
            store.close()
            try TestPostgres.psql(url, "INSERT INTO opqd.hosts VALUES (\(values))")
            let reopened = try PostgresStore(url: url)
            defer { reopened.close() }
            let name = values.hasPrefix("'nohost'") ? "nohost" : "a:80"
            func refused(_ error: any Error) -> Bool {
                guard let e = error as? PostgresStoreError, e.reason == .corrupt else { return false }
                return e.detail.contains("hosts row \"\(name)\": column \(column) ")
            }
            #expect {
                _ = try reopened.load()
            } throws: { error in
                refused(error)
            }
            #expect {
                _ = try reopened.load(queues: ["q"])
            } throws: { error in
                refused(error)
            }
            let pool = PGReadPool(url: url)
            defer { pool.close() }
            #expect {
                _ = try pool.host(named: name)
            } throws: { error in
                (error as? PGReadDamaged)?.description.contains("hosts row \"\(name)\": column \(column) ") == true
            }
        }
    }

    /// Hosts belong to no partition: a commit of a host's records and breaker events is fenced
    /// like one of limiters (any one partition held will do; none held, none written), never by
    /// the partition its name would have as a queue's; an instance taking partitions gets every
    /// host, whoever wrote it; a follower reads one as committed.
    @Test func hostCommitsNeedNoPartitionOfTheirOwnAndEveryAdoptionLoadsThemAll() throws {
        try withTestDatabase { url in
            let (qa, pa, _, _) = queuesInTwoPartitions()
            let host = hostOutside(partition: pa)
            let a = try PGMembership(url: url, instanceID: "a", leaseSeconds: 5)
            let b = try PGMembership(url: url, instanceID: "b", leaseSeconds: 5)
            defer { a.close(); b.close() }
            let won = try a.claim([pa], token: "ta")
            let fencedStore = try FencedStore(url: url, instance: "a", holding: won)
            let (store, fenced) = (fencedStore.store, fencedStore.fenced)
            defer { store.close() }
            let engine = QueueEngine(kinds: ["host": HostTestKind()], store: store)
            // Host-only commits (its record and its breaker event) of an instance that holds a
            // partition, not the one the host's name hashes to: fenced by the one held, written.
            try engine.setHost(host, breaker: .open, reason: "maintenance")
            #expect(waitDurable(store, engine.currentTicket))
            #expect(fenced.value == 0)
            #expect(
                try TestPostgres.psql(url, "SELECT host || ' ' || state || ' ' || manual_breaker || ' ' || manual_reason FROM opqd.hosts")
                    == "\(host) open open maintenance")
            #expect(
                try TestPostgres.psql(url, "SELECT queue || ' ' || operation || ' ' || key || ' ' || old || ' ' || new FROM opqd.events ORDER BY seq")
                    == #"\#(host) 0 breaker "closed" "open""#)
            // A commit of its partition's queue and operations held for the host.
            try engine.createQueue(name: qa, maxConcurrentOperationCount: 10)
            let ops = try (0..<2).map { _ in try engine.addOperationID(to: qa, OperationRequest(kind: "host", spec: .object([("host", .string(host))]))) }
            #expect(waitDurable(store, engine.currentTicket))
            #expect(fenced.value == 0)
            // A follower reads the host as it was committed; a host never stored is none.
            let pool = PGReadPool(url: url)
            defer { pool.close() }
            #expect(try pool.host(named: host) == engine.host(named: host))
            #expect(try pool.host(named: "unknown:1") == nil)

            // Another instance (b) that holds no partition yet writes its host unfenced...
            let other = try FencedStore(url: url, instance: "b", holding: [:])
            defer { other.store.close() }
            let kindB = HostTestKind()
            let engineB = QueueEngine(kinds: ["host": kindB], store: other.store)
            try engineB.setHost("b.example:80", breaker: .closed)
            #expect(waitDurable(other.store, engineB.currentTicket))
            #expect(other.fenced.value == 0)
            // ...and, taking a's partition (a gave it up), gets every host with the operations.
            try a.release(won)
            let wonB = try b.claim([pa], token: "tb")
            #expect(wonB.count == 1)
            let (recovered, _) = try other.store.load(queues: [qa])
            #expect(recovered.hosts.map(\.host) == ["b.example:80", host].sorted())
            #expect(recovered.operations.map(\.id) == ops)
            engineB.adopt(recovered, remote: RemoteStates())
            let adopted = try engineB.host(named: host)
            #expect(adopted.state == .open && adopted.manual?.reason == "maintenance" && adopted.held == 2, "the host came before its operations")
            #expect(kindB.starts == 0)
            // The breaker event is read back with its host, key and states.
            let events = other.store.events(of: OperationID(raw: 0), after: 0, limit: 10)
            #expect(events.map(\.queue) == [host] && events.map(\.key) == [.breaker])
            #expect(events.first?.old == .breaker(.closed) && events.first?.new == .breaker(.open))

            // a, cut off past every lease it held, writes no host any more, as it writes no meta.
            try engine.setHost("late.example:80", breaker: .open)
            #expect(!waitDurable(store, engine.currentTicket, timeout: 1.5), "nothing of a fenced host write is durable")
            #expect(fenced.value == 1)
            #expect(try TestPostgres.psql(url, "SELECT count(*) FROM opqd.hosts WHERE host = 'late.example:80'") == "0")
            #expect(try TestPostgres.psql(url, "SELECT count(*) FROM opqd.events WHERE queue = 'late.example:80'") == "0")
        }
    }
}
