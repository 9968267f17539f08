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
        ("admission", "'debounce x k'"), ("admission", "'singleton '"), ("admission", "'fifo k'"), ("admission", "'debounce -1 k'"),
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

    /// Flow control's columns (API.md "Flow control") hold only what the engine accepts.
    @Test(arguments: [
        ("limits", "'not json'"), ("limits", "'{}'"), ("limits", "'[1]'"), ("limits", #"'[{"limiter":"a"}]'"#),
        ("limits", #"'[{"limiter":"a","key":5}]'"#), ("limits", #"'[{"limiter":"a","key":"k","x":1}]'"#),
        ("limits", #"'[{"limiter":"bad name","key":""}]'"#), ("limits", #"'[{"limiter":"a","key":"k"},{"limiter":"a","key":"k"}]'"#),
        ("limits", "'[" + (0..<9).map { #"{"limiter":"l\#($0)","key":""}"# }.joined(separator: ",") + "]'"),
        ("limits", #"'[{"limiter":"a","key":"\#(String(repeating: "k", count: 129))"}]'"#),
        ("fairness_key", "'\(String(repeating: "f", count: 129))'"),
    ])
    func aDamagedFlowColumnOfAnOperationFailsTheLoad(column: String, value: String) throws {
        try withTemporaryDirectory { dir in
            try damaged(dir, "UPDATE operations SET \(column) = \(value) WHERE id = 2")
            try expectCorruptLoad(dir, mentioning: "operations row op-0000000000000002: column \(column) ")
        }
    }

    @Test(arguments: [
        ("rate_per_second = 0, rate_burst = 1", "rate_per_second"), ("rate_per_second = -1, rate_burst = 1", "rate_per_second"),
        ("rate_per_second = 100001, rate_burst = 1", "rate_per_second"), ("rate_per_second = 9e999, rate_burst = 1", "rate_per_second"),
        ("rate_per_second = 'NaN', rate_burst = 1", "rate_per_second"), ("rate_per_second = 1, rate_burst = 0", "rate_burst"),
        ("rate_per_second = 1, rate_burst = -3", "rate_burst"), ("rate_per_second = 1", "rate_burst"), ("rate_burst = 2", "rate_per_second"),
        ("fairness_weights = '[]'", "fairness_weights"), (#"fairness_weights = '{"a":0}'"#, "fairness_weights"),
        (#"fairness_weights = '{"a":1.5}'"#, "fairness_weights"), (#"fairness_weights = '{"a":"x"}'"#, "fairness_weights"),
        ("fairness_weights = '{'", "fairness_weights"),
    ])
    func aDamagedFlowColumnOfAQueueFailsTheLoad(set: String, column: String) throws {
        try withTemporaryDirectory { dir in
            try damaged(dir, "UPDATE queues SET \(set)")
            try expectCorruptLoad(dir, mentioning: "queues row q: column \(column) ")
        }
    }

    @Test(arguments: [
        ("'bad name', 1, NULL, NULL, NULL, 0, 1", "name"), ("'l', 0, NULL, NULL, NULL, 0, 1", "concurrency"),
        ("'l', -1, NULL, NULL, NULL, 0, 1", "concurrency"), ("'l', NULL, NULL, NULL, NULL, 0, 1", "concurrency"),
        ("'l', NULL, 0.0001, 1, NULL, 0, 1", "rate_per_second"), ("'l', NULL, 1, 0, NULL, 0, 1", "rate_burst"),
        ("'l', NULL, 1, NULL, NULL, 0, 1", "rate_burst"), ("'l', NULL, NULL, 4, NULL, 0, 1", "rate_per_second"), ("'l', 1, NULL, NULL, 'x', 0, 1", "overrides"),
        (#"'l', 1, NULL, NULL, '{"k":{}}', 0, 1"#, "overrides"), (#"'l', 1, NULL, NULL, '{"k":{"concurrency":0}}', 0, 1"#, "overrides"),
        (#"'l', 1, NULL, NULL, '{"k":{"rate":{"perSecond":0,"burst":1}}}', 0, 1"#, "overrides"),
        (#"'l', 1, NULL, NULL, '{"k":{"rate":{"perSecond":1}}}', 0, 1"#, "overrides"), (#"'l', 1, NULL, NULL, '[]', 0, 1"#, "overrides"),
        ("'l', 1, NULL, NULL, NULL, 0, -1", "revision"),
    ])
    func aDamagedLimiterRowFailsTheLoad(values: String, column: String) throws {
        let name = values.hasPrefix("'bad name'") ? "bad name" : "l"
        try withTemporaryDirectory { dir in
            try damaged(dir, "INSERT INTO limiters VALUES (\(values))")
            try expectCorruptLoad(dir, mentioning: "limiters row \"\(name)\": column \(column) ")
        }
    }

    @Test(arguments: [
        ("'nohost', 'open', 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, 1", "host"),
        ("'a:80', 'ajar', 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, 1", "state"),
        ("'a:80', 'open', -1, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, 1", "consecutive_failures"),
        ("'a:80', 'open', 0, NULL, NULL, NULL, 'x', NULL, NULL, NULL, 0, 1", "last_error"),
        ("'a:80', 'open', 0, NULL, NULL, NULL, '[1]', NULL, NULL, NULL, 0, 1", "last_error"),
        ("'a:80', 'open', 0, NULL, NULL, NULL, NULL, 'shut', NULL, NULL, 0, 1", "manual_breaker"),
        ("'a:80', 'open', 0, NULL, NULL, NULL, NULL, NULL, 5, NULL, 0, 1", "manual_breaker"),
        ("'a:80', 'open', 0, NULL, NULL, NULL, NULL, NULL, NULL, 'why', 0, 1", "manual_breaker"),
        ("'a:80', 'open', 0, NULL, NULL, NULL, NULL, 'open', NULL, replace(hex(zeroblob(513)), '00', 'r'), 0, 1", "manual_reason"),
        ("'a:80', 'open', 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, -1, 1", "reopenings"),
        ("'a:80', 'open', 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 63, 1", "reopenings"),
        ("'a:80', 'open', 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, -1", "revision"),
    ])
    func aDamagedHostRowFailsTheLoad(values: String, column: String) throws {
        let name = values.hasPrefix("'nohost'") ? "nohost" : "a:80"
        try withTemporaryDirectory { dir in
            try damaged(dir, "INSERT INTO hosts VALUES (\(values))")
            try expectCorruptLoad(dir, mentioning: "hosts row \"\(name)\": column \(column) ")
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
