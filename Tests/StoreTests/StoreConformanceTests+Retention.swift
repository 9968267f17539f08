import QueueEngine
import StoreKit
import Testing

/// What goes away by age (finished operations, kept answers) and what stays across a restart.
extension StoreConformanceTests {
    /// Idempotency records: saved whole, loaded back, purged by age. The memory store keeps its
    /// cache in memory only (the API's), so it loads none and purges none.
    @Test(arguments: StoreKind.allCases)
    func idempotencyRecordsAreSavedWholeAndPurgedByAge(kind: StoreKind) throws {
        try StorePlace.with(kind) { place in
            let store = try place.open()
            _ = try store.recoverState()
            let old = IdempotencyRecord(
                scope: "POST /v1/queues|k1", bodyHash: "h1", status: 201, headers: [("Location", "/v1/queues/a"), ("X", "1")],
                body: Array(#"{"name":"a"}"#.utf8), createdAt: t0)
            let new = IdempotencyRecord(
                scope: "POST /v1/queues|k2", bodyHash: "h2", status: 422, headers: [], body: [0, 1, 2, 255], createdAt: t0.adding(seconds: 100))
            // As the engine hands them over: in a change's records (`StoreRecord.kept`).
            #expect(store.commit([.kept(old)], ticket: 1))
            #expect(store.commit([.kept(new)], ticket: 2))
            guard store.isDurable else {
                #expect(store.loadIdempotency().isEmpty)
                #expect(store.purgeIdempotency(before: t0.adding(seconds: 50)) == 0)
                return
            }
            #expect(store.loadIdempotency().sorted { $0.scope < $1.scope } == [old, new])
            #expect(store.purgeIdempotency(before: t0.adding(seconds: 50)) == 1)
            #expect(store.loadIdempotency() == [new])
        }
    }

}
