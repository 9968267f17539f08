import Foundation
import QueueEngine
import Testing

@testable import SQLiteStore

/// A database that opens and passes `quick_check` but holds values opqd never writes
/// (edited by hand, or a bug of another version). Each used to trap (`Int(1e300)`,
/// `migrations[-1]`, `lastSeq + 1`); now the start fails with a `StoreError` naming the file.
@Suite struct DamagedRecordTests {
    /// A small sound store, then `sql` run on it behind the store's back.
    func damaged(_ dir: TemporaryDirectory, _ sql: String) throws {
        try makeStore(in: dir, operations: 3)
        let conn = try SQLiteConnection(path: dir.database, create: false)
        try conn.execute(sql)
        conn.close()
    }

    /// Opens the store and loads it, expecting a `.corrupt` error that names the file.
    func expectCorruptLoad(_ dir: TemporaryDirectory, mentioning word: String, sourceLocation: SourceLocation = #_sourceLocation) throws {
        let store = try SQLiteStore(directory: dir.path)
        defer { store.close() }
        do {
            let state = try store.load()
            Issue.record("loaded \(state.operations.count) operations from a damaged store", sourceLocation: sourceLocation)
        } catch {
            #expect(error.reason == .corrupt, sourceLocation: sourceLocation)
            #expect(error.description.contains(dir.database), sourceLocation: sourceLocation)
            #expect(error.description.contains(word), "\(error.description)", sourceLocation: sourceLocation)
        }
    }

    @Test(arguments: [
        #"{"maxAttempts":1e300,"backoff":1,"multiplier":2}"#,
        #"{"maxAttempts":-5,"backoff":1,"multiplier":2}"#,
        #"{"maxAttempts":2.5,"backoff":1,"multiplier":2}"#,
        #"{"maxAttempts":3,"backoff":-1,"multiplier":2}"#,
        #"{"maxAttempts":3,"backoff":1,"multiplier":1e309}"#,
    ])
    func anOutOfRangeRetryFailsTheLoad(retry: String) throws {
        try withTemporaryDirectory { dir in
            try damaged(dir, "UPDATE operations SET retry = '\(retry)' WHERE id = 2")
            try expectCorruptLoad(dir, mentioning: "retry")
        }
    }

    @Test(arguments: [
        ("attempt", "-1"), ("attempt", "9223372036854775807"), ("executed_seconds", "-1.0"),
        ("executed_seconds", "9e999"), ("timeout", "-9e999"), ("revision", "-1"), ("id", "0"), ("id", "-5"),
    ])
    func anOutOfRangeOperationColumnFailsTheLoad(column: String, value: String) throws {
        try withTemporaryDirectory { dir in
            try damaged(dir, "UPDATE operations SET \(column) = \(value) WHERE id = 2")
            try expectCorruptLoad(dir, mentioning: column)
        }
    }

    @Test(arguments: [("max_concurrent", "0"), ("max_concurrent", "-7"), ("revision", "-1")])
    func anOutOfRangeQueueColumnFailsTheLoad(column: String, value: String) throws {
        try withTemporaryDirectory { dir in
            try damaged(dir, "UPDATE queues SET \(column) = \(value)")
            try expectCorruptLoad(dir, mentioning: column)
        }
    }

    @Test func aNegativeSchemaVersionIsRefused() throws {
        try withTemporaryDirectory { dir in
            try damaged(dir, "PRAGMA user_version = -1")
            let error = try #require(openFailure(dir.path))
            #expect(error.reason == .corrupt)
            #expect(error.description.contains(dir.database))
        }
    }

    @Test(arguments: ["-1", "9223372036854775807"])
    func anOutOfRangeLastSeqIsRefused(value: String) throws {
        try withTemporaryDirectory { dir in
            // -1 everywhere reads back as UInt64.max, whose `+ 1` trapped.
            try damaged(
                dir,
                """
                DELETE FROM events; INSERT OR REPLACE INTO meta(key, value) VALUES ('last_seq', \(value));
                INSERT INTO events VALUES (\(value), 0, 'q', 1, 'isReady', NULL, 'true', 'ready')
                """)
            let error = try #require(openFailure(dir.path))
            #expect(error.reason == .corrupt)
            #expect(error.description.contains(dir.database))
        }
    }

    @Test func eventsWithImpossibleSeqsAreLeftOutOfTheFeed() throws {
        try withTemporaryDirectory { dir in
            try damaged(dir, "UPDATE events SET seq = 0 WHERE seq = 1")
            let store = try SQLiteStore(directory: dir.path)
            defer { store.close() }
            let seqs = store.recentEvents(limit: 10).map(\.seq)
            #expect(!seqs.contains(0))
            #expect(store.oldestEventSeq >= 1)
        }
    }
}
