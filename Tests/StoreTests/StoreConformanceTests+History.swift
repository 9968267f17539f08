import QueueEngine
import StoreKit
import Testing

/// A queue's history (API.md "History") is durable: its buckets are written on a timer with
/// the next commit, come back after a restart, and go with their queue when it is deleted.
extension StoreConformanceTests {
    @Test(arguments: StoreKind.durable)
    func historySurvivesARestartAndGoesWithItsQueue(kind: StoreKind) throws {
        try StorePlace.with(kind) { place in
            let clock = ManualClock()
            let store = try place.openDurable()
            let engine = QueueEngine(kinds: ["manual": HostTestKind()], store: store, clock: clock, scheduler: clock)
            try engine.createQueue(name: "q", maxConcurrentOperationCount: 100)
            try engine.createQueue(name: "gone", maxConcurrentOperationCount: 100)
            for _ in 0..<5 { try engine.addOperationID(to: "q", OperationRequest(kind: "manual")) }
            try engine.addOperationID(to: "gone", OperationRequest(kind: "manual"))
            clock.advance(seconds: 61)
            for _ in 0..<2 { try engine.addOperationID(to: "q", OperationRequest(kind: "manual")) }
            // The flush timer: changed buckets go with the next commit.
            clock.advance(seconds: 2.5)
            #expect(waitDurable(engine))
            let since = clock.now().adding(seconds: -3600)
            let before = try engine.history(of: "q", step: 60, since: since).buckets
            #expect(before.map(\.created) == [5, 2] && before.allSatisfy { $0.started == $0.created })
            try engine.deleteQueue("gone", force: true)
            #expect(waitDurable(engine))
            store.close()

            let store2 = try place.openDurable()
            let recovered = try store2.load()
            #expect(Set(recovered.history.map(\.queue)) == ["q"], "the deleted queue's rows went with it")
            #expect(recovered.history.filter { $0.step == 60 }.count == 2 && recovered.history.filter { $0.step == 3600 }.count >= 1)
            let engine2 = QueueEngine(kinds: ["manual": HostTestKind()], store: store2, clock: clock, scheduler: clock)
            engine2.restore(recovered)
            let after = try engine2.history(of: "q", step: 60, since: since).buckets
            #expect(after.map(\.created) == [5, 2] && after.map(\.start) == before.map(\.start))
            #expect(after.map(\.wait) == before.map(\.wait), "the sketches too")
            #expect(engine2.historyOfAll(step: 3600, since: since).buckets.reduce(0) { $0 + $1.created } == 7)
            store2.close()
        }
    }
}
