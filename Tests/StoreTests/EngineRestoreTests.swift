import QueueEngine
import SQLiteStore
import Testing

@Suite struct EngineRestoreTests {
    /// A queue's revision moves with every change of its operations; each commit stores it, so
    /// a restart goes on past the last one committed (never back to the last settings change).
    @Test func aQueuesRevisionIsStoredWithEveryCommitAndARestartGoesOnPastIt() throws {
        try withTemporaryDirectory { dir in
            let kind = ManualKind()
            let store = try SQLiteStore(directory: dir.path)
            let engine = QueueEngine(kinds: ["manual": kind], store: store)
            try engine.createQueue(name: "work", maxConcurrentOperationCount: 1)
            let created = try engine.queue(named: "work").revision
            let a = try engine.addOperationID(to: "work", OperationRequest(kind: "manual"))
            let b = try engine.addOperationID(to: "work", OperationRequest(kind: "manual"))
            _ = try engine.addOperationID(to: "work", OperationRequest(kind: "manual"))
            kind.finish(a)
            kind.finish(b)
            // The third one executes: the restarts below restart it by its kind's rule, which is
            // a change of its own after the bump.
            #expect(waitDurable(engine))
            let live = try engine.queue(named: "work").revision
            #expect(live > created + 5)
            store.close()
            // Three restarts: the first one's own change (the executing operation fails) stores
            // a revision anyway; the next ones change nothing but the bump, which is stored too.
            var previous = live
            for _ in 0..<3 {
                let again = try SQLiteStore(directory: dir.path)
                defer { again.close() }
                let recovered = try again.load()
                #expect(recovered.queues.first?.revision == previous)
                let restarted = QueueEngine(kinds: ["manual": ManualKind()], store: again)
                restarted.restore(recovered)
                let now = try restarted.queue(named: "work").revision
                #expect(now > previous)
                #expect(waitDurable(restarted))
                previous = now
            }
        }
    }
}
