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

    @Test func anEngineRebuiltFromTheStoreContinuesWhereItStopped() throws {
        try withTemporaryDirectory { dir in
            let kind = ManualKind()
            let store = try SQLiteStore(directory: dir.path)
            let engine = QueueEngine(kinds: ["manual": kind, "immediate": ImmediateKind()], store: store)
            try engine.createQueue(name: "work", maxConcurrentOperationCount: 1)
            try engine.createQueue(name: "held", isSuspended: true)
            try engine.createQueue(name: "busy", maxConcurrentOperationCount: 1)
            try engine.createQueue(name: "tmp")

            let a = try engine.addOperationID(to: "work", OperationRequest(kind: "manual", name: "a", spec: .object([("x", .number(1))])))
            let b = try engine.addOperationID(to: "work", OperationRequest(kind: "manual", name: "b", queuePriority: .high, dependencies: [a]))
            let c = try engine.addOperationID(to: "held", OperationRequest(kind: "immediate", name: "c"))
            let d = try engine.addOperationID(to: "work", OperationRequest(kind: "manual", name: "d"))
            try engine.cancel(d)
            try engine.pause(a)  // executing -> paused: frees the slot
            let e = try engine.addOperationID(
                to: "work",
                OperationRequest(
                    kind: "manual", name: "e",
                    options: OperationOptions(timeout: 300)))
            #expect(try engine.operation(e).state == .executing)
            kind.finish(e, .succeeded(.string("ok")))
            let h = try engine.addOperationID(to: "busy", OperationRequest(kind: "manual", name: "h"))
            let f = try engine.addOperationID(to: "tmp", OperationRequest(kind: "immediate"))
            try engine.deleteQueue("tmp")
            #expect(waitDurable(engine))

            let before = Dictionary(uniqueKeysWithValues: [a, b, c, d, e, h].map { ($0, try! engine.operation($0)) })
            let nextSeq = engine.nextSequence
            store.close()

            let kind2 = ManualKind()
            let store2 = try SQLiteStore(directory: dir.path)
            defer { store2.close() }
            let recovered = try store2.load()
            #expect(recovered.lastSeq == nextSeq - 1)
            let engine2 = QueueEngine(kinds: ["manual": kind2, "immediate": ImmediateKind()], store: store2)
            engine2.restore(recovered)

            #expect(engine2.queues().map(\.name) == ["busy", "held", "work"])
            #expect(try engine2.queue(named: "held").isSuspended)
            #expect(try engine2.queue(named: "work").maxConcurrentOperationCount == 1)
            #expect(throws: EngineError.self) { try engine2.operation(f) }

            let a2 = try engine2.operation(a)
            #expect(a2.state == .paused && a2.startedAt == before[a]!.startedAt && a2.spec == before[a]!.spec)
            let b2 = try engine2.operation(b)
            #expect(b2.state == .pending && b2.dependencies == [a] && b2.queuePriority == .high)
            #expect(try engine2.operation(c).state == .ready)
            let d2 = try engine2.operation(d)
            #expect(d2.state == .finished && d2.isCancelled && d2.outcome == .cancelled)
            let e2 = try engine2.operation(e)
            #expect(e2.state == .finished && e2.outcome == .succeeded && e2.result == .string("ok") && e2.options.timeout == 300)
            // h was executing when the store closed: the manual kind's default recovery fails it.
            let h2 = try engine2.operation(h)
            #expect(h2.state == .finished && h2.outcome == .failed)
            #expect(engine2.nextSequence > nextSeq)

            // The event sequence continues across the restart.
            let resumedAt = engine2.nextSequence
            try engine2.resume(a)
            #expect(kind2.starts(of: a).last?.isResume == true)
            #expect(waitDurable(engine2))
            let events = store2.events(of: a)
            #expect(events.first?.seq ?? 0 < nextSeq)
            #expect(events.last.map { $0.seq >= resumedAt } == true)
            #expect(events.map(\.seq) == events.map(\.seq).sorted())

            // The operation added after the restart gets a fresh id.
            let g = try engine2.addOperationID(to: "work", OperationRequest(kind: "manual"))
            #expect(g > h)
        }
    }
}
