import Foundation
import QueueEngine
import Testing

@testable import SQLiteStore

/// Writes `bytes` over the file at `offset`.
func overwrite(_ path: String, at offset: UInt64, with bytes: [UInt8]) throws {
    let handle = try #require(FileHandle(forUpdatingAtPath: path))
    try handle.seek(toOffset: offset)
    handle.write(Data(bytes))
    try handle.close()
}

/// A store with a few hundred operations, closed (WAL checkpointed into the main file).
func makeStore(in dir: TemporaryDirectory, operations: Int = 300) throws {
    let store = try SQLiteStore(directory: dir.path)
    store.append([.queue(queueSnapshot("q"))], upTo: 1)
    for i in 1...operations {
        var op = operationSnapshot(UInt64(i))
        op.spec = .string(String(repeating: "x", count: 200))
        store.append([.operation(op), .event(event(UInt64(i), UInt64(i)))], upTo: UInt64(i + 1))
    }
    #expect(waitDurable(store, UInt64(operations + 1)))
    store.close()
}

/// A file as schema `version` wrote it, made by that version's own migrations (they are only
/// ever appended to), with a queue `q` and operations 1...3 (each with one event) in the
/// columns every version has.
func makeOldStore(in dir: TemporaryDirectory, version: Int) throws {
    try FileManager.default.createDirectory(atPath: dir.path, withIntermediateDirectories: true)
    let conn = try SQLiteConnection(path: dir.database, create: true)
    defer { conn.close() }
    for v in 0..<version { try conn.execute(Schema.migrations[v]) }
    try conn.execute("PRAGMA user_version = \(version); PRAGMA application_id = \(Schema.applicationID)")
    try conn.execute(
        "INSERT INTO queues (name, max_concurrent, effective_max, is_suspended, revision, created_at) VALUES ('q', -1, 4, 0, 1, \(t0.nanoseconds))")
    for i in 1...3 {
        try conn.execute(
            """
            INSERT INTO operations (id, queue, kind, spec, priority, state, is_cancelled, dependencies, attempt, created_at, revision, \
            executed_seconds) VALUES (\(i), 'q', 'delay', '{"seconds":1}', 0, 'ready', 0, '[]', 0, \(t0.nanoseconds), 1, 0);
            INSERT INTO events VALUES (\(i), \(t0.nanoseconds), 'q', \(i), 'isReady', NULL, 'true', 'ready');
            """)
    }
}

/// Opens the store expecting a `StoreError`; returns it.
func openFailure(_ dir: String) -> StoreError? {
    do {
        let s = try SQLiteStore(directory: dir)
        s.close()
        return nil
    } catch {
        return error
    }
}

@Suite struct OpenFailureTests {
    @Test func garbageOverTheHeaderIsRefusedNamingTheFile() throws {
        try withTemporaryDirectory { dir in
            try makeStore(in: dir)
            try overwrite(dir.database, at: 0, with: Array("this is not a database at all, sorry!!".utf8) + [UInt8](repeating: 0xA5, count: 200))
            let error = try #require(openFailure(dir.path))
            #expect(error.reason == .notADatabase)
            #expect(error.path == dir.database)
            #expect(error.description.contains(dir.database))
            // Nothing was written over it.
            let head = try #require(FileManager.default.contents(atPath: dir.database))
            #expect(head.starts(with: Array("this is not a database".utf8)))
        }
    }

    @Test func aFileThatIsNotADatabaseIsRefused() throws {
        try withTemporaryDirectory { dir in
            #expect(FileManager.default.createFile(atPath: dir.database, contents: Data(repeating: 0x42, count: 10_000)))
            let error = try #require(openFailure(dir.path))
            #expect(error.reason == .notADatabase)
            #expect(error.description.contains(dir.database))
        }
    }

    @Test func aDamagedPageFailsTheCheck() throws {
        try withTemporaryDirectory { dir in
            try makeStore(in: dir, operations: 2000)
            let size = try #require(try FileManager.default.attributesOfItem(atPath: dir.database)[.size] as? UInt64)
            #expect(size > 40 * 4096)
            // Scribble over the middle pages, keeping the header (page 1) intact.
            for page in stride(from: UInt64(2), to: size / 4096, by: 3) {
                try overwrite(dir.database, at: page * 4096, with: [UInt8](repeating: 0x0D, count: 64))
            }
            let error = try #require(openFailure(dir.path))
            #expect(error.reason == .corrupt)
            #expect(error.description.contains(dir.database))
        }
    }

    @Test func aNewerSchemaIsRefused() throws {
        try withTemporaryDirectory { dir in
            try makeStore(in: dir, operations: 1)
            let conn = try SQLiteConnection(path: dir.database, create: false)
            try conn.execute("PRAGMA user_version = 99")
            conn.close()
            let error = try #require(openFailure(dir.path))
            #expect(error.reason == .newerSchema(found: 99, supported: Schema.version))
            #expect(Schema.version == 7)
            #expect(error.description.contains("99"))
        }
    }

    @Test func aFileOfTheFirstSchemaIsMigrated() throws {
        try withTemporaryDirectory { dir in
            // The file as the first schema wrote it: no cascade_at column, user_version 1.
            try makeOldStore(in: dir, version: 1)
            let store = try SQLiteStore(directory: dir.path)
            let state = try store.load()
            #expect(state.operations.count == 3)
            #expect(state.operations.allSatisfy { $0.cascadeAt == nil })
            var op = operationSnapshot(4)
            op.cascadeAt = t0
            store.append([.operation(op)], upTo: 5)
            #expect(waitDurable(store, 5))
            store.close()
            let again = try SQLiteStore(directory: dir.path)
            defer { again.close() }
            #expect(try again.load().operations.last?.cascadeAt == t0)
            let check = try SQLiteConnection(path: dir.database, create: false)
            defer { check.close() }
            #expect(try check.integer("PRAGMA user_version") == Int64(Schema.version))
        }
    }

    /// Schema 2, before flow control: its rows come back with none (no rate, no weights, no
    /// limits, no fairness key, no limiters), and the migrated file keeps what flow control adds.
    @Test func aFileOfTheSchemaBeforeFlowControlIsMigrated() throws {
        try withTemporaryDirectory { dir in
            try makeOldStore(in: dir, version: 2)
            let store = try SQLiteStore(directory: dir.path)
            let state = try store.load()
            #expect(state.queues.map(\.name) == ["q"])
            #expect(state.queues.first?.rateLimit == nil && state.queues.first?.fairnessWeights == [:])
            #expect(state.operations.map(\.id.raw) == [1, 2, 3])
            #expect(state.operations.allSatisfy { $0.options == OperationOptions() })
            #expect(state.limiters.isEmpty)
            #expect(state.lastSeq == 3)
            var q = queueSnapshot("q", revision: 2)
            q.rateLimit = RateLimit(perSecond: 7.5, burst: 8)
            q.fairnessWeights = ["a": 2]
            var op = operationSnapshot(2)
            op.options = OperationOptions(limits: [LimitRef(limiter: "l", key: "k")], fairnessKey: "a")
            let l = LimiterSnapshot(
                name: "l", settings: LimiterSettings(concurrency: 1, overrides: ["k": LimiterBudget(concurrency: 2)]), createdAt: t0, revision: 1)
            store.append([.limiter(l), .queue(q), .operation(op)], upTo: 5)
            #expect(waitDurable(store, 5))
            store.close()
            let again = try SQLiteStore(directory: dir.path)
            defer { again.close() }
            let migrated = try again.load()
            #expect(migrated.limiters == [l])
            #expect(migrated.queues.first?.rateLimit == q.rateLimit && migrated.queues.first?.fairnessWeights == q.fairnessWeights)
            #expect(migrated.operations.first { $0.id.raw == 2 } == op)
            #expect(migrated.operations.count == 3)
            let check = try SQLiteConnection(path: dir.database, create: false)
            defer { check.close() }
            #expect(try check.integer("PRAGMA user_version") == Int64(Schema.version))
        }
    }

    /// Schema 3, before hosts: it comes back with none, and the migrated file keeps them.
    @Test func aFileOfTheSchemaBeforeHostsIsMigrated() throws {
        try withTemporaryDirectory { dir in
            try makeOldStore(in: dir, version: 3)
            let store = try SQLiteStore(directory: dir.path)
            #expect(try store.load().hosts.isEmpty)
            let h = HostSnapshot(host: "a:80", state: .open, openedAt: t0, until: t0.adding(seconds: 5), revision: 2)
            store.append([.host(h)], upTo: 5)
            #expect(waitDurable(store, 5))
            store.close()
            let again = try SQLiteStore(directory: dir.path)
            defer { again.close() }
            #expect(try again.load().hosts == [h])
            let check = try SQLiteConnection(path: dir.database, create: false)
            defer { check.close() }
            #expect(try check.integer("PRAGMA user_version") == Int64(Schema.version))
        }
    }

    @Test func anotherProgramsDatabaseIsRefused() throws {
        try withTemporaryDirectory { dir in
            let conn = try SQLiteConnection(path: dir.database, create: true)
            try conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT); INSERT INTO customers VALUES (1, 'x')")
            conn.close()
            let error = try #require(openFailure(dir.path))
            #expect(error.reason == .foreignDatabase)
        }
    }

    @Test func aDirectoryPathThatIsAFileIsRefused() throws {
        try withTemporaryDirectory { dir in
            let path = dir.file("plain-file")
            #expect(FileManager.default.createFile(atPath: path, contents: Data("x".utf8)))
            let error = try #require(openFailure(path))
            #expect(error.reason == .notADirectory)
            #expect(error.description.contains(path))
            let below = try #require(openFailure(path + "/sub"))
            #expect(below.reason == .cannotCreateDirectory)
        }
    }

    @Test(.enabled(if: getuid() != 0, "root reads and writes files whatever their mode"))
    func anUnreadableFileIsRefused() throws {
        try withTemporaryDirectory { dir in
            try makeStore(in: dir, operations: 1)
            chmod(dir.database, 0)
            defer { chmod(dir.database, 0o644) }
            let error = try #require(openFailure(dir.path))
            #expect(error.reason == .cannotOpen)
            #expect(error.description.contains(dir.database))
        }
    }

    @Test func aStoreInUseIsRefused() throws {
        try withTemporaryDirectory { dir in
            let store = try SQLiteStore(directory: dir.path)
            let error = try #require(openFailure(dir.path))
            #expect(error.reason == .inUse)
            store.close()
            let again = try SQLiteStore(directory: dir.path)
            again.close()
        }
    }

    @Test func anEmptyFileBecomesAStore() throws {
        try withTemporaryDirectory { dir in
            #expect(FileManager.default.createFile(atPath: dir.database, contents: Data()))
            let store = try SQLiteStore(directory: dir.path)
            store.close()
        }
    }
}
