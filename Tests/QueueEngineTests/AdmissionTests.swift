import QueueEngine
import Testing

/// Admission in the engine, on a manual clock (API.md "Admission: debounce and singleton").
extension Engine {
    @Suite struct Admissions {
        func request(_ spec: Int, _ admission: Admission, limits: [LimitRef] = [], kind: String = "manual") -> OperationRequest {
            var r = OperationRequest(kind: kind, spec: .object([("n", .number(Double(spec)))]), options: OperationOptions(limits: limits))
            r.admission = admission
            return r
        }

        func debounce(_ key: String, _ seconds: Double, max: Double? = nil) -> Admission {
            .debounce(key: key, seconds: seconds, maxSeconds: max ?? seconds * 10)
        }

        func spec(_ op: OperationSnapshot) -> Double? {
            if case let .number(n)? = op.spec?["n"] { return n }
            return nil
        }

        @Test func debounceMergesUntilTheEditsStopAndStartsAfterTheQuietTime() throws {
            let f = Fixture()
            try f.queue("q", max: 10)
            let t0 = f.clock.now()
            let first = try f.engine.admitOperation(to: "q", request(1, debounce("user-1", 2)))
            #expect(first.outcome == .created && first.operation.state == .pending)
            #expect(first.operation.options.notBefore == t0.adding(seconds: 2))
            f.clock.advance(seconds: 1.5)
            let second = try f.engine.admitOperation(to: "q", request(2, debounce("user-1", 2)))
            #expect(second.outcome == .merged && second.operation.id == first.operation.id)
            #expect(spec(second.operation) == 2, "the latest spec wins")
            #expect(second.operation.options.notBefore == t0.adding(seconds: 3.5), "moved to 2 s after the latest create")
            f.clock.advance(seconds: 1.9)
            #expect(!f.kind.wasStarted(first.operation.id), "not before the quiet time after the latest create")
            f.clock.advance(seconds: 0.2)
            #expect(f.kind.started == [first.operation.id])
            // Once it started, a create of the same key is a new operation.
            let third = try f.engine.admitOperation(to: "q", request(3, debounce("user-1", 2)))
            #expect(third.outcome == .created && third.operation.id != first.operation.id)
            // Other keys are apart.
            let other = try f.engine.admitOperation(to: "q", request(4, debounce("user-2", 2)))
            #expect(other.outcome == .created && other.operation.id != third.operation.id)
        }

        @Test func maxSecondsCapsAStreamThatNeverStops() throws {
            let f = Fixture()
            try f.queue("q", max: 10)
            let t0 = f.clock.now()
            let first = try f.engine.admitOperation(to: "q", request(0, debounce("k", 2, max: 5)))
            var n = 1
            // A create every second: without the cap, it would never start.
            while !f.kind.wasStarted(first.operation.id) && n < 20 {
                f.clock.advance(seconds: 1)
                let made = try f.engine.admitOperation(to: "q", request(n, debounce("k", 2, max: 5)))
                if !f.kind.wasStarted(first.operation.id) {
                    #expect(made.outcome == .merged && made.operation.id == first.operation.id)
                    #expect(made.operation.options.notBefore.map { $0 <= t0.adding(seconds: 5) } == true, "never after the cap")
                }
                n += 1
            }
            let started = try #require(f.kind.entries.first { $0.call == .start })
            #expect(started.context.operation == first.operation.id)
            // Wake-ups come a millisecond late (`notBefore` is read on the wall clock).
            let startedAt = try #require(try f.snapshot(first.operation.id).startedAt)
            #expect(
                startedAt >= t0.adding(seconds: 5) && startedAt <= t0.adding(seconds: 5.01),
                "started at the cap, 5 s after the first create: \(startedAt) vs \(t0)")
        }

        @Test func aMergeMovesAReadyOperationOffItsLimiterKey() throws {
            let f = Fixture()
            try f.queue("q", max: 10)
            try f.engine.createLimiter(name: "stripe", settings: LimiterSettings(concurrency: 1))
            let busy = try f.engine.addOperationID(
                to: "q", OperationRequest(kind: "manual", options: OperationOptions(limits: [LimitRef(limiter: "stripe", key: "a")])))
            // Debounced with the quiet time passed: ready, parked on key a behind `busy`.
            let held = try f.engine.admitOperation(to: "q", request(1, debounce("d", 0.5), limits: [LimitRef(limiter: "stripe", key: "a")]))
            f.clock.advance(seconds: 0.6)
            #expect(try f.state(held.operation.id) == .ready && f.kind.started == [busy])
            #expect(try f.engine.limiterKeys("stripe").keys.first { $0.key == "a" }?.waiting == 1)
            let moved = try f.engine.admitOperation(to: "q", request(2, debounce("d", 0.5), limits: [LimitRef(limiter: "stripe", key: "b")]))
            #expect(moved.outcome == .merged && moved.operation.state == .pending, "its start moved: pending again")
            let keys = try f.engine.limiterKeys("stripe").keys
            #expect(keys.first { $0.key == "a" }?.waiting == 0, "key a no longer counts it")
            f.clock.advance(seconds: 0.6)
            #expect(f.kind.started == [busy, held.operation.id], "key b has room: it starts")
            #expect(try f.engine.limiter(named: "stripe").running == 2)
        }

        @Test func singletonSkipKeepsOneUnfinished() throws {
            let f = Fixture()
            try f.queue("q", max: 10)
            let a = try f.engine.admitOperation(to: "q", request(1, .singleton(key: "sync", mode: .skip)))
            #expect(a.outcome == .created && f.kind.started == [a.operation.id])
            let b = try f.engine.admitOperation(to: "q", request(2, .singleton(key: "sync", mode: .skip)))
            #expect(b.outcome == .skipped && b.operation.id == a.operation.id && spec(b.operation) == 1, "nothing changed")
            #expect(try f.engine.operations(in: "q").operations.count == 1)
            f.kind.finish(a.operation.id)
            let c = try f.engine.admitOperation(to: "q", request(3, .singleton(key: "sync", mode: .skip)))
            #expect(c.outcome == .created && c.operation.id != a.operation.id)
        }

        @Test func singletonReplaceWaitingKeepsOneRunningAndOneWaiting() throws {
            let f = Fixture()
            try f.queue("q", max: 10)
            let mode = Admission.singleton(key: "sync", mode: .replaceWaiting)
            let a = try f.engine.admitOperation(to: "q", request(1, mode))
            #expect(a.outcome == .created && f.kind.started == [a.operation.id])
            let b = try f.engine.admitOperation(to: "q", request(2, mode))
            #expect(b.outcome == .created && b.operation.dependencies == [a.operation.id] && b.operation.state == .pending)
            let c = try f.engine.admitOperation(to: "q", request(3, mode))
            #expect(c.outcome == .merged && c.operation.id == b.operation.id && spec(c.operation) == 3)
            #expect(try f.engine.operations(in: "q").operations.count == 2)
            f.kind.finish(a.operation.id)
            #expect(f.kind.started == [a.operation.id, b.operation.id])
            let d = try f.engine.admitOperation(to: "q", request(4, mode))
            #expect(d.outcome == .created && d.operation.dependencies == [b.operation.id])
            // skip with the same key: an unfinished one stands for it.
            let e = try f.engine.admitOperation(to: "q", request(5, .singleton(key: "sync", mode: .skip)))
            #expect(e.outcome == .skipped && e.operation.id == d.operation.id)
        }

        @Test func aKeyOfAnotherKindIsRefusedAndNothingChanges() throws {
            let f = Fixture()
            try f.queue("q", max: 10)
            let a = try f.engine.admitOperation(to: "q", request(1, debounce("k", 5)))
            do {
                _ = try f.engine.admitOperation(to: "q", request(2, debounce("k", 5), kind: "immediate"))
                Issue.record("a create of another kind under the key was accepted")
            } catch {
                guard case let .conflict(slug, _) = error else { throw error }
                #expect(slug == "admission-kind-mismatch")
            }
            let after = try f.snapshot(a.operation.id)
            #expect(spec(after) == 1 && after.revision == a.operation.revision)
        }

        @Test func aBatchMergesIntoItsOwnEarlierElements() throws {
            let f = Fixture()
            try f.queue("q", max: 10)
            var elements = [
                BatchElement(queue: "q", request: request(1, debounce("k", 5))),
                BatchElement(queue: "q", request: request(2, debounce("k", 5))),
                BatchElement(queue: "q", request: OperationRequest(kind: "manual"), dependencies: [.element(1)]),
                BatchElement(queue: "q", request: request(4, .singleton(key: "s", mode: .skip))),
                BatchElement(queue: "q", request: request(5, .singleton(key: "s", mode: .skip))),
            ]
            let made = try f.engine.admitOperations(elements)
            #expect(made.map(\.outcome) == [.created, .merged, nil, .created, .skipped])
            #expect(made[1].operation.id == made[0].operation.id && spec(made[1].operation) == 2)
            #expect(made[2].operation.dependencies == [made[0].operation.id], "a ref to a merged element names the operation that absorbed it")
            #expect(made[4].operation.id == made[3].operation.id)
            #expect(try f.engine.operations(in: "q").operations.count == 3)
            // The next batch meets them as existing operations; a kind mismatch refuses all of it.
            elements = [
                BatchElement(queue: "q", request: request(6, .singleton(key: "s", mode: .skip))),
                BatchElement(queue: "q", request: request(7, debounce("k", 5), kind: "immediate")),
            ]
            #expect(throws: BatchRefusal.self) { try f.engine.admitOperations(elements) }
            #expect(try f.engine.operations(in: "q").operations.count == 3 && spec(f.snapshot(made[0].operation.id)) == 2)
        }

        @Test func aScheduleTemplatesAdmissionSkipsWhileItsRunIsUnfinished() throws {
            let f = Fixture()
            try f.queue("q", max: 10)
            var template = OperationRequest(kind: "manual")
            template.admission = .singleton(key: "nightly", mode: .skip)
            let start = f.clock.now()
            try f.engine.createSchedule(in: "q", ScheduleSpec(name: "n", rule: .every(10), template: template, overlap: .allow, startAt: start))
            f.clock.advance(seconds: 30.1)
            let s = try f.engine.schedule(in: "q", named: "n")
            #expect(s.runs == 1 && s.skipped == 2, "the first run is unfinished: the singleton skips the next two")
            #expect(try f.engine.operations(in: "q").operations.count == 1)
        }

        @Test func aFinishedOperationLeavesTheIndex() throws {
            let f = Fixture()
            try f.queue("q", max: 10)
            for i in 0..<100 {
                let a = try f.engine.admitOperation(to: "q", request(i, .singleton(key: "k\(i)", mode: .skip)))
                f.kind.finish(a.operation.id)
            }
            #expect(try f.engine.admissionKeys(in: "q") == 0)
        }
    }
}
