import QueueEngine
import Testing

/// A `manual` kind with a default retry policy (as `external` has).
final class RetryingManualKind: OperationKind {
    let inner = ManualKind()
    var defaultRetry: RetryPolicy? { RetryPolicy(maxAttempts: 3, backoff: 0, multiplier: 1) }
    func start(_ context: ExecutionContext) { inner.start(context) }
    func cancel(_ context: ExecutionContext) { inner.cancel(context) }
    func pause(_ context: ExecutionContext) { inner.pause(context) }
}

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

        @Test func aMergeInABatchKeepsTheKindsDefaultRetry() throws {
            let kind = RetryingManualKind()
            let clock = ManualClock()
            let engine = QueueEngine(kinds: ["manual": kind], store: InMemoryStore(), clock: clock, scheduler: clock)
            try engine.createQueue(name: "q", maxConcurrentOperationCount: 10)
            let made = try engine.admitOperations([
                BatchElement(queue: "q", request: request(1, debounce("k", 5))),
                BatchElement(queue: "q", request: request(2, debounce("k", 5))),
            ])
            #expect(made.map(\.outcome) == [.created, .merged])
            #expect(made[1].operation.options.retry == kind.defaultRetry, "a merge in a batch takes the create's options as a single create does")
            // The same merge by a single create, for comparison.
            let single = try engine.admitOperation(to: "q", request(3, debounce("k", 5)))
            #expect(single.outcome == .merged && single.operation.options.retry == kind.defaultRetry)
        }

        @Test func aRestoreOutOfCreationOrderKeepsTheOperationNotStartedForItsDebounceKey() throws {
            // A cluster instance takes a queue whose newer operations have lower ids (each
            // instance hands out ids from its own block): the one not started still absorbs.
            let f = Fixture()
            try f.queue("q", max: 10)
            let started = try f.engine.admitOperation(to: "q", request(1, debounce("k", 0.5)))
            f.clock.advance(seconds: 0.6)
            #expect(f.kind.wasStarted(started.operation.id))
            // Paused mid-run: it stays unfinished across the restore.
            try f.engine.pause(started.operation.id)
            let waiting = try f.engine.admitOperation(to: "q", request(2, debounce("k", 5)))
            #expect(waiting.outcome == .created)
            var older = try f.snapshot(started.operation.id)
            var newer = try f.snapshot(waiting.operation.id)
            // Ids swapped: the newer operation has the lower id.
            (older.id, newer.id) = (newer.id, older.id)
            let g = Fixture()
            g.engine.restore(RecoveredState(queues: [try f.engine.queue(named: "q")], operations: [older, newer]))
            let next = try g.engine.admitOperation(to: "q", request(3, debounce("k", 5)))
            #expect(next.outcome == .merged && next.operation.id == newer.id, "the create merges into the operation that has not started")
            #expect(try g.engine.operations(in: "q").operations.count == 2)
        }

        @Test func aRestoreOutOfCreationOrderKeepsTheNewestSingletonLast() throws {
            let f = Fixture()
            try f.queue("q", max: 10)
            let mode = Admission.singleton(key: "s", mode: .replaceWaiting)
            let running = try f.engine.admitOperation(to: "q", request(1, mode))
            let waiting = try f.engine.admitOperation(to: "q", request(2, mode))
            #expect(f.kind.wasStarted(running.operation.id) && waiting.outcome == .created)
            try f.engine.pause(running.operation.id)
            var older = try f.snapshot(running.operation.id)
            var newer = try f.snapshot(waiting.operation.id)
            (older.id, newer.id) = (newer.id, older.id)
            newer.dependencies = [older.id]
            let g = Fixture()
            g.engine.restore(RecoveredState(queues: [try f.engine.queue(named: "q")], operations: [older, newer]))
            let skipped = try g.engine.admitOperation(to: "q", request(3, .singleton(key: "s", mode: .skip)))
            #expect(skipped.outcome == .skipped && skipped.operation.id == newer.id, "skip answers the newest unfinished operation of the key")
        }

        @Test func aDebouncedOperationWaitsOnItsDebounceNotANotBefore() throws {
            let f = Fixture()
            try f.queue("q", max: 10)
            let t0 = f.clock.now()
            let a = try f.engine.admitOperation(to: "q", request(1, debounce("k", 2)))
            #expect(try f.snapshot(a.operation.id).waitingOn == [.debounce(until: t0.adding(seconds: 2))])
            f.clock.advance(seconds: 1)
            _ = try f.engine.admitOperation(to: "q", request(2, debounce("k", 2)))
            #expect(try f.snapshot(a.operation.id).waitingOn == [.debounce(until: t0.adding(seconds: 3))])
            // An operation without an admission waits on its notBefore, as before.
            let plain = try f.add("q", notBefore: t0.adding(seconds: 10))
            #expect(try f.snapshot(plain).waitingOn == [.notBefore(until: t0.adding(seconds: 10))])
        }

        @Test func aTriggerSkippedByItsTemplatesAdmissionIsASkipEvenWithTheQueueFull() throws {
            var c = EngineConfiguration()
            c.maxUnfinishedPerQueue = 2
            let f = Fixture(configuration: c)
            try f.queue("q", max: 10)
            _ = try f.add("q")
            let y = try f.add("q")
            var template = OperationRequest(kind: "manual")
            template.admission = .singleton(key: "s", mode: .skip)
            try f.engine.createSchedule(in: "q", ScheduleSpec(name: "n", rule: .every(10), template: template, overlap: .allow, startAt: f.clock.now()))
            // A run while the queue is full: missed.
            f.clock.advance(seconds: 10.1)
            #expect(try f.engine.schedule(in: "q", named: "n").missed == 1)
            f.kind.finish(y)
            let first = try f.engine.triggerScheduleAdmitted(in: "q", named: "n")
            #expect(first?.outcome == .created)
            // Full again, and the key's operation is unfinished: the template's singleton skips.
            let second = try f.engine.triggerScheduleAdmitted(in: "q", named: "n")
            #expect(second == nil, "a skip, not a refusal for a full queue")
            let s = try f.engine.schedule(in: "q", named: "n")
            #expect(s.missed == 1 && s.skipped == 1 && s.runs == 1, "runs \(s.runs), skipped \(s.skipped), missed \(s.missed)")
        }

        @Test func aTriggerWhoseTemplateKeyStandsForAnotherKindIsRefusedAndChangesNothing() throws {
            let f = Fixture()
            try f.queue("q", max: 10)
            // A create of another kind holds the debounce key.
            _ = try f.engine.admitOperation(to: "q", request(1, debounce("k", 100), kind: "immediate"))
            var template = OperationRequest(kind: "manual")
            template.admission = debounce("k", 5)
            try f.engine.createSchedule(in: "q", ScheduleSpec(name: "n", rule: .every(3600), template: template, overlap: .allow, startAt: f.clock.now()))
            do {
                _ = try f.engine.triggerScheduleAdmitted(in: "q", named: "n")
                Issue.record("the trigger was answered as if the policy had skipped it")
            } catch {
                guard case let .conflict(slug, _) = error else { throw error }
                #expect(slug == "admission-kind-mismatch")
            }
            let s = try f.engine.schedule(in: "q", named: "n")
            #expect(s.runs == 0 && s.skipped == 0 && s.missed == 0)
        }

        @Test func aMergeIntoAnOperationHeldByARampingHostLeavesTheRampAlone() throws {
            let kind = HostKind()
            let clock = ManualClock()
            var c = EngineConfiguration()
            c.breaker = BreakerSettings(failures: 3, openSeconds: 5, maxOpenSeconds: 300)
            let engine = QueueEngine(kinds: ["host": kind], store: InMemoryStore(), clock: clock, scheduler: clock, configuration: c)
            let events = EventLog(engine)
            try engine.createQueue(name: "q", maxConcurrentOperationCount: 100)
            func op(_ n: Int, _ priority: QueuePriority = .normal, _ admission: Admission? = nil) -> OperationRequest {
                var r = OperationRequest(kind: "host", queuePriority: priority, spec: .object([("host", .string("a:80")), ("n", .number(Double(n)))]))
                r.admission = admission
                return r
            }
            let trips = try (0..<3).map { try engine.addOperationID(to: "q", op($0)) }
            for id in trips { kind.fail(id) }
            #expect(try engine.host(named: "a:80").state == .open)
            let first = try engine.addOperationID(to: "q", op(3))
            // Debounced with no room to move its start (maxSeconds = seconds): a merge keeps it ready.
            let d = Admission.debounce(key: "k", seconds: 0.1, maxSeconds: 0.1)
            let held = try engine.admitOperation(to: "q", op(4, .normal, d)).operation.id
            clock.advance(seconds: 0.2)
            let canary = try engine.addOperationID(to: "q", op(5, .high))
            clock.advance(seconds: 5.6)
            #expect(kind.started.last == canary)
            kind.succeed(canary)
            #expect(try engine.host(named: "a:80").state == .ramping)
            #expect(kind.started.last == first, "second 0 of the ramp: one start")
            let merged = try engine.admitOperation(to: "q", op(6, .normal, d))
            #expect(merged.outcome == .merged && merged.operation.id == held && merged.operation.state == .ready)
            #expect(try engine.host(named: "a:80").state == .ramping, "the held backlog is not gone: the merged operation is still held")
            #expect(!kind.started.contains(held), "not before the ramp's next second")
            #expect(!events.all.contains { $0.key == .breaker && $0.new == .breaker(.closed) })
            clock.advance(seconds: 1.01)
            #expect(kind.started.last == held)
        }
    }
}
