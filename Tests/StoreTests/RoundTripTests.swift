import QueueEngine
import SQLiteStore
import Testing

/// What only the SQLite store does on a round trip: it keeps the engine's seqs (PostgreSQL numbers
/// events in the commit: `PostgresStoreTests.eventsAreNumberedInTheCommitWhateverSeqTheEngineGaveThem`).
/// The round trips every store shares are `StoreConformanceTests`'.
@Suite struct RoundTripTests {
    @Test func aRepeatedEventSeqReplacesTheOldEventInsteadOfWedgingTheWriter() throws {
        try withTemporaryDirectory { dir in
            let store = try SQLiteStore(directory: dir.path)
            defer { store.close() }
            store.append([.event(event(1, 1)), .event(event(2, 1))], upTo: 1)
            #expect(waitDurable(store, 1))
            // As an engine that skipped `restore` would: its seq starts at 1 again.
            let again = event(1, 7, key: .isFinished)
            store.append([.event(again), .operation(operationSnapshot(7))], upTo: 2)
            #expect(waitDurable(store, 2))
            #expect(store.recentEvents(limit: 10) == [again, event(2, 1)])
            #expect(try store.load().operations.map(\.id.raw) == [7])
            #expect(store.lastError == nil)
        }
    }
}
