import Dispatch
import Foundation
import PostgresStore
import QueueEngine
import Testing

/// Flow control on PostgreSQL beyond the round trip every store shares
/// (`StoreConformanceTests.flowControlSurvivesCloseAndReopen`): the migration from schema 9,
/// damaged rows, and limiters in a cluster, which belong to no partition.
extension PostgresStoreTests {
    @Test func aDatabaseOfSchema9IsMigratedAndKeepsWhatFlowControlAdds() throws {
        try withTestDatabase { url in
            let store = try PostgresStore(url: url)
            store.append([.queue(queueSnapshot("q")), .operation(operationSnapshot(1)), .event(event(1, 1))], upTo: 1)
            #expect(waitDurable(store, 1))
            store.close()
            // The database as schema 9 left it: none of version 10's columns, no limiters (and
            // nothing of version 11's).
            try TestPostgres.psql(
                url,
                """
                \(PostgresLeaseTests.dropSchema11)
                ALTER TABLE opqd.queues DROP COLUMN rate_per_second, DROP COLUMN rate_burst, DROP COLUMN fairness_weights;
                ALTER TABLE opqd.operations DROP COLUMN limits, DROP COLUMN fairness_key;
                DROP TABLE opqd.limiters; UPDATE opqd.schema_version SET version = 9
                """)
            let migrated = try PostgresStore(url: url)
            let state = try migrated.load()
            #expect(state.queues.map(\.name) == ["q"] && state.queues.first?.rateLimit == nil && state.queues.first?.fairnessWeights == [:])
            #expect(state.operations.map(\.options) == [OperationOptions()])
            #expect(state.limiters.isEmpty && state.lastSeq == 1)
            #expect(try TestPostgres.psql(url, "SELECT version FROM opqd.schema_version") == "15")
            var q = queueSnapshot("q", revision: 2)
            q.rateLimit = RateLimit(perSecond: 0.5, burst: 2)
            q.fairnessWeights = ["t": 4]
            var op = operationSnapshot(1)
            op.options = OperationOptions(limits: [LimitRef(limiter: "l", key: "k")], fairnessKey: "t")
            let l = LimiterSnapshot(name: "l", settings: LimiterSettings(rate: RateLimit(perSecond: 3, burst: 3)), createdAt: t0, revision: 2)
            migrated.append([.queue(q), .limiter(l), .operation(op)], upTo: 2)
            #expect(waitDurable(migrated, 2))
            migrated.close()
            let again = try PostgresStore(url: url)
            defer { again.close() }
            let after = try again.load()
            #expect(after.limiters == [l] && after.operations == [op])
            #expect(after.queues.first?.rateLimit == q.rateLimit && after.queues.first?.fairnessWeights == q.fairnessWeights)
        }
    }

    @Test(arguments: [
        ("limits", "'{}'"), ("limits", #"'[{"limiter":"a"}]'"#), ("limits", #"'[{"limiter":"a","key":"k"},{"limiter":"a","key":"k"}]'"#),
        ("limits", "'[" + (0..<9).map { #"{"limiter":"l\#($0)","key":""}"# }.joined(separator: ",") + "]'"),
        ("fairness_key", "convert_to(repeat('f', 129), 'UTF8')"),
    ])
    func aDamagedFlowColumnOfAnOperationFailsTheLoadNamingIt(column: String, value: String) throws {
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
                return e.detail.contains("operations row 1: column \(column) ")
            }
            // A follower's read of it fails the same way.
            let pool = PGReadPool(url: url)
            defer { pool.close() }
            #expect(throws: PGReadDamaged.self) { _ = try pool.operation(OperationID(raw: 1)) }
        }
    }

    @Test(arguments: [
        ("rate_per_second = 0, rate_burst = 1", "rate_per_second"), ("rate_per_second = 'NaN', rate_burst = 1", "rate_per_second"),
        ("rate_per_second = 'Infinity', rate_burst = 1", "rate_per_second"), ("rate_per_second = 1, rate_burst = 0", "rate_burst"),
        ("rate_per_second = 1", "rate_burst"), ("rate_burst = 3", "rate_per_second"),
        (#"fairness_weights = '{"a":0}'"#, "fairness_weights"), ("fairness_weights = '[1]'", "fairness_weights"),
    ])
    func aDamagedFlowColumnOfAQueueFailsTheLoadNamingIt(set: String, column: String) throws {
        try withTestDatabase { url in
            let store = try PostgresStore(url: url)
            store.append([.queue(queueSnapshot("q"))], upTo: 1)
            #expect(waitDurable(store, 1))
            store.close()
            try TestPostgres.psql(url, "UPDATE opqd.queues SET \(set)")
            let reopened = try PostgresStore(url: url)
            defer { reopened.close() }
            #expect {
                _ = try reopened.load()
            } throws: { error in
                (error as? PostgresStoreError)?.reason == .corrupt
                    && (error as? PostgresStoreError)?.detail.contains("queues row q: column \(column) ") == true
            }
            let pool = PGReadPool(url: url)
            defer { pool.close() }
            #expect(throws: PGReadDamaged.self) { _ = try pool.queue(named: "q") }
        }
    }

    @Test(arguments: [
        ("'bad name', 1, NULL, NULL, NULL, 0, 1", "name"), ("'l', 0, NULL, NULL, NULL, 0, 1", "concurrency"),
        ("'l', NULL, NULL, NULL, NULL, 0, 1", "concurrency"), ("'l', NULL, 'NaN', 1, NULL, 0, 1", "rate_per_second"),
        ("'l', NULL, 1, -1, NULL, 0, 1", "rate_burst"), (#"'l', 1, NULL, NULL, '{"k":{"concurrency":1.5}}', 0, 1"#, "overrides"),
        ("'l', 1, NULL, NULL, 'nope', 0, 1", "overrides"), ("'l', 1, NULL, NULL, NULL, 0, -1", "revision"),
    ])
    func aDamagedLimiterRowFailsTheLoadAndTheTakingOfPartitions(values: String, column: String) throws {
        try withTestDatabase { url in
            let store = try PostgresStore(url: url)
            store.close()
            try TestPostgres.psql(url, "INSERT INTO opqd.limiters VALUES (\(values))")
            let reopened = try PostgresStore(url: url)
            defer { reopened.close() }
            let name = values.hasPrefix("'bad name'") ? "bad name" : "l"
            func refused(_ error: any Error) -> Bool {
                guard let e = error as? PostgresStoreError, e.reason == .corrupt else { return false }
                return e.detail.contains("limiters row \"\(name)\": column \(column) ")
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
        }
    }

    /// Limiters belong to no partition: a commit of limiters alone is fenced like one of meta
    /// alone (any one partition held will do; none held, none written), and an instance taking
    /// partitions gets every limiter, whoever wrote it, with the operations that name them.
    @Test func limiterCommitsNeedNoPartitionOfTheirOwnAndEveryAdoptionLoadsThemAll() throws {
        try withTestDatabase { url in
            let (qa, pa, _, _) = queuesInTwoPartitions()
            let a = try PGMembership(url: url, instanceID: "a", leaseSeconds: 5)
            let b = try PGMembership(url: url, instanceID: "b", leaseSeconds: 5)
            defer { a.close(); b.close() }
            let won = try a.claim([pa], token: "ta")
            let fencedStore = try FencedStore(url: url, instance: "a", holding: won)
            let (store, fenced) = (fencedStore.store, fencedStore.fenced)
            defer { store.close() }
            let kind = ManualKind()
            let engine = QueueEngine(kinds: ["manual": kind], store: store)
            // Limiter-only commits of an instance that holds a partition: fenced by it, written.
            try engine.createLimiter(name: "stripe", settings: LimiterSettings(concurrency: 1, overrides: ["vip": LimiterBudget(concurrency: 2)]))
            try engine.createLimiter(name: "tmp", settings: LimiterSettings(concurrency: 1))
            #expect(waitDurable(store, engine.currentTicket))
            try engine.updateLimiter("stripe", concurrency: .some(2))
            try engine.deleteLimiter("tmp")
            #expect(waitDurable(store, engine.currentTicket))
            #expect(fenced.value == 0)
            #expect(try TestPostgres.psql(url, "SELECT name || ':' || concurrency FROM opqd.limiters ORDER BY name") == "stripe:2")
            // A commit of its partition's queue and operations naming the limiter.
            try engine.createQueue(name: qa, maxConcurrentOperationCount: 10)
            let ref = LimitRef(limiter: "stripe", key: "acct")
            let ops = try (0..<3).map { _ in
                try engine.addOperationID(to: qa, OperationRequest(kind: "manual", options: OperationOptions(limits: [ref], fairnessKey: "t")))
            }
            #expect(waitDurable(store, engine.currentTicket))

            // Another instance (b) that holds no partition yet writes its limiter unfenced...
            let other = try FencedStore(url: url, instance: "b", holding: [:])
            defer { other.store.close() }
            // Its kind resumes what was executing on a, so the keys' counts carry over as they were.
            let engineB = QueueEngine(kinds: ["manual": ResumingKind()], store: other.store)
            try engineB.createLimiter(name: "mail", settings: LimiterSettings(rate: RateLimit(perSecond: 2, burst: 4)))
            #expect(waitDurable(other.store, engineB.currentTicket))
            #expect(other.fenced.value == 0)
            // ...and, taking a's partition (a gave it up), gets every limiter with its operations.
            try a.release(won)
            let wonB = try b.claim([pa], token: "tb")
            #expect(wonB.count == 1)
            let (recovered, _) = try other.store.load(queues: [qa])
            #expect(recovered.limiters.map(\.name) == ["mail", "stripe"])
            #expect(recovered.operations.map(\.id) == ops && recovered.operations.allSatisfy { $0.options.limits == [ref] && $0.options.fairnessKey == "t" })
            engineB.adopt(recovered, remote: RemoteStates())
            let stripe = try engineB.limiter(named: "stripe")
            #expect(stripe.settings == LimiterSettings(concurrency: 2, overrides: ["vip": LimiterBudget(concurrency: 2)]))
            #expect(stripe.running == 2 && stripe.waiting == 1, "the limiter came before its operations: two run, one waits for acct")
            #expect(try engineB.limiter(named: "mail").settings.rate == RateLimit(perSecond: 2, burst: 4), "one b had is kept")

            // a, cut off past every lease it held (its writer still names the partition b
            // took), writes no limiter any more, as it writes no meta.
            try engine.createLimiter(name: "late", settings: LimiterSettings(concurrency: 1))
            #expect(!waitDurable(store, engine.currentTicket, timeout: 1.5), "nothing of a fenced limiter write is durable")
            #expect(fenced.value == 1)
            #expect(try TestPostgres.psql(url, "SELECT count(*) FROM opqd.limiters WHERE name = 'late'") == "0")
        }
    }
}
