import QueueEngine
import StoreKit
import Testing

/// Admission (API.md "Admission: debounce and singleton") is durable: the key an operation was
/// created with comes back with it, and a restarted engine knows which operation stands for each
/// key; a schedule's template keeps its admission.
extension StoreConformanceTests {
    @Test(arguments: StoreKind.durable)
    func admissionKeysSurviveARestart(kind: StoreKind) throws {
        try StorePlace.with(kind) { place in
            let clock = ManualClock()
            let store = try place.openDurable()
            let engine = QueueEngine(kinds: ["manual": HostTestKind()], store: store, clock: clock, scheduler: clock)
            try engine.createQueue(name: "q", maxConcurrentOperationCount: 100)
            func request(_ n: Double, _ a: Admission) -> OperationRequest {
                var r = OperationRequest(kind: "manual", spec: .object([("n", .number(n))]))
                r.admission = a
                return r
            }
            let debounce = Admission.debounce(key: "user \"1\" 🚀", seconds: 60, maxSeconds: 120)
            let waiting = Admission.singleton(key: "sync", mode: .replaceWaiting)
            let d = try engine.admitOperation(to: "q", request(1, debounce))
            let running = try engine.admitOperation(to: "q", request(2, waiting))
            let queued = try engine.admitOperation(to: "q", request(3, waiting))
            var template = OperationRequest(kind: "manual")
            template.admission = .singleton(key: "nightly", mode: .skip)
            try engine.createSchedule(in: "q", ScheduleSpec(name: "n", rule: .every(3600), template: template))
            #expect(d.outcome == .created && running.outcome == .created && queued.outcome == .created)
            #expect(waitDurable(engine))
            store.close()

            clock.advance(seconds: 30)
            let store2 = try place.openDurable()
            let recovered = try store2.load()
            #expect(recovered.operations.first { $0.id == d.operation.id }?.admission?.key == debounce.key)
            #expect(recovered.operations.first { $0.id == d.operation.id }?.admission?.since == d.operation.createdAt)
            #expect(recovered.schedules.first?.spec.template.admission == template.admission)
            let engine2 = QueueEngine(kinds: ["manual": HostTestKind()], store: store2, clock: clock, scheduler: clock)
            engine2.restore(recovered)
            let merged = try engine2.admitOperation(to: "q", request(4, debounce))
            #expect(merged.outcome == .merged && merged.operation.id == d.operation.id)
            // The cap counts from the first create, before the restart: 120 s after it.
            #expect(merged.operation.options.notBefore == d.operation.createdAt.adding(seconds: 90))
            // The running one was executing at the stop: this kind fails it on recovery, and the
            // waiting one starts. The key still knows both.
            #expect(try engine2.operation(running.operation.id).state == .finished)
            let skipped = try engine2.admitOperation(to: "q", request(5, .singleton(key: "sync", mode: .skip)))
            #expect(skipped.outcome == .skipped && skipped.operation.id == queued.operation.id)
            let next = try engine2.admitOperation(to: "q", request(6, waiting))
            #expect(next.outcome == .created && next.operation.dependencies == [queued.operation.id])
            let replaced = try engine2.admitOperation(to: "q", request(7, waiting))
            #expect(replaced.outcome == .merged && replaced.operation.id == next.operation.id && replaced.operation.spec?["n"] == .number(7))
            #expect(waitDurable(engine2))
            store2.close()
        }
    }
}
