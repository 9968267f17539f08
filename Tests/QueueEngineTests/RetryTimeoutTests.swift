import QueueEngine
import Testing

extension Engine {
    @Suite("Retry and timeout")
    struct RetryTimeoutTests {
        private func add(_ f: Fixture, retry: RetryPolicy? = nil, timeout: Double? = nil) throws -> OperationID {
            try f.engine.addOperationID(to: "q", OperationRequest(kind: "manual", options: OperationOptions(timeout: timeout, retry: retry)))
        }

        @Test("a failed attempt is retried after its backoff until one succeeds, each retry an attempt change")
        func retryUntilSuccess() throws {
            let f = Fixture()
            try f.queue("q")
            let log = EventLog(f.engine)
            let id = try add(f, retry: RetryPolicy(maxAttempts: 3, backoff: 0.02, multiplier: 1))
            f.kind.finish(id, .failed(type: "flaky", detail: "first"))
            #expect(try f.snapshot(id).attempt == 2)
            #expect(try f.state(id) == .executing, "it keeps its slot while waiting to retry")
            f.clock.advance(seconds: 0.019)
            #expect(f.kind.calls(.start, for: id).count == 1, "not before its backoff")
            f.clock.advance(seconds: 0.001)
            #expect(f.kind.calls(.start, for: id).count == 2)
            f.kind.finish(id, .failed(type: "flaky", detail: "second"))
            f.clock.advance(seconds: 0.02)
            #expect(f.kind.calls(.start, for: id).count == 3)
            #expect(f.kind.calls(.start, for: id).map(\.attempt) == [1, 2, 3])
            f.kind.finish(id, .succeeded(.string("third time")))
            let s = try f.snapshot(id)
            #expect(s.outcome == .succeeded && s.result == .string("third time"))
            #expect(log.of(id).filter { $0.key == .attempt }.map(describe) == ["attempt: 1->2", "attempt: 2->3"])
        }

        @Test("the last allowed failure finishes the operation failed")
        func retriesExhausted() throws {
            let f = Fixture()
            try f.queue("q")
            let id = try add(f, retry: RetryPolicy(maxAttempts: 2, backoff: 0.01, multiplier: 1))
            f.kind.finish(id, .failed(type: "bad", detail: "1"))
            f.clock.advance(seconds: 0.01)
            #expect(f.kind.calls(.start, for: id).count == 2)
            f.kind.finish(id, .failed(type: "bad", detail: "2"))
            let s = try f.snapshot(id)
            #expect(s.state == .finished && s.outcome == .failed)
            #expect(s.error?["type"] == .string("bad"))
        }

        @Test("cancelling an operation that waits to retry finishes it cancelled and starts no further attempt")
        func cancelDuringBackoff() throws {
            let f = Fixture()
            try f.queue("q")
            let id = try add(f, retry: RetryPolicy(maxAttempts: 3, backoff: 0.05, multiplier: 1))
            f.kind.finish(id, .failed(type: "flaky", detail: "first"))
            try f.engine.cancel(id)
            #expect(try f.state(id) == .finished, "no work is running, so nothing will report the end of the cancelled run")
            f.clock.advance(seconds: 0.1)  // past the backoff
            #expect(f.kind.calls(.start, for: id).count == 1, "a cancelled operation must not start another attempt")
            #expect(try f.snapshot(id).outcome == .cancelled)
        }

        @Test("an attempt that runs longer than its timeout fails with timeout and its kind is asked to stop")
        func timeout() throws {
            let f = Fixture()
            try f.queue("q")
            let id = try add(f, timeout: 0.05)
            f.clock.advance(seconds: 0.049)
            #expect(try f.state(id) == .executing, "not before its timeout")
            f.clock.advance(seconds: 0.001)
            #expect(try f.state(id) == .finished)
            let s = try f.snapshot(id)
            #expect(s.outcome == .failed)
            #expect(s.error?["type"] == .string("timeout"))
            #expect(f.kind.calls(.cancel, for: id).count == 1)
            f.kind.finish(id)  // the stopped work's late report changes nothing
            #expect(try f.snapshot(id).outcome == .failed)
        }
    }
}
