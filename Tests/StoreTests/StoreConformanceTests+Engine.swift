import QueueEngine
import StoreKit
import Testing

/// The engine on the store: what it committed rebuilds it after a restart.
extension StoreConformanceTests {
    @Test(arguments: StoreKind.durable)
    func anEngineRebuiltFromTheStoreContinuesWhereItStopped(kind: StoreKind) throws {
        try StorePlace.with(kind) { place in
            let manual = ManualKind()
            let store = try place.openDurable()
            let engine = QueueEngine(kinds: ["manual": manual, "immediate": ImmediateKind()], store: store)
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
            manual.finish(e, .succeeded(.string("ok")))
            let h = try engine.addOperationID(to: "busy", OperationRequest(kind: "manual", name: "h"))
            let f = try engine.addOperationID(to: "tmp", OperationRequest(kind: "immediate"))
            try engine.deleteQueue("tmp")
            #expect(waitDurable(engine))

            let before = Dictionary(uniqueKeysWithValues: [a, b, c, d, e, h].map { ($0, try! engine.operation($0)) })
            let nextSeq = engine.nextSequence
            store.close()

            let manual2 = ManualKind()
            let store2 = try place.openDurable()
            let recovered = try store2.load()
            #expect(recovered.lastSeq == nextSeq - 1)
            let engine2 = QueueEngine(kinds: ["manual": manual2, "immediate": ImmediateKind()], store: store2)
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
            #expect(manual2.starts(of: a).last?.isResume == true)
            #expect(waitDurable(engine2))
            let events = try #require(store2.history(of: a, after: 0, limit: 1000))
            #expect(events.first?.seq ?? 0 < nextSeq)
            #expect(events.last.map { $0.seq >= resumedAt } == true)
            #expect(events.map(\.seq) == events.map(\.seq).sorted())

            // The operation added after the restart gets a fresh id.
            let g = try engine2.addOperationID(to: "work", OperationRequest(kind: "manual"))
            #expect(g > h)
        }
    }
}
