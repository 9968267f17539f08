import QueueEngine
import Testing

/// Admission cases found in review: merges into operations in unusual states, batches, and
/// a restore that brings back operations out of their creation order.
extension Engine {
    @Suite struct AdmissionEdges {
        func request(_ n: Int, _ admission: Admission?, kind: String = "manual") -> OperationRequest {
            var r = OperationRequest(kind: kind, spec: .object([("n", .number(Double(n)))]))
            r.admission = admission
            return r
        }

        func debounce(_ key: String, _ seconds: Double) -> Admission { .debounce(key: key, seconds: seconds, maxSeconds: seconds * 10) }

        @Test func aPausedOperationMergedToAnEarlierStartStartsThenOnceResumed() throws {
            let f = Fixture()
            try f.queue("q", max: 10)
            let t0 = f.clock.now()
            let a = try f.engine.admitOperation(to: "q", request(1, debounce("k", 100)))
            try f.engine.pause(a.operation.id)
            // The next create asks for a shorter quiet time: its start moves earlier.
            let m = try f.engine.admitOperation(to: "q", request(2, debounce("k", 1)))
            #expect(m.outcome == .merged && m.operation.options.notBefore == t0.adding(seconds: 1))
            try f.engine.resume(a.operation.id)
            f.clock.advance(seconds: 1.1)
            #expect(f.kind.wasStarted(a.operation.id), "it waits for its own notBefore (1 s), not the one it had when paused (100 s)")
        }
    }
}
