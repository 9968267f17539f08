import QueueEngine
import Schedules
import StoreKit
import Testing

/// Schedules (API.md "Schedules") are durable: their settings, their cursor and counts, and the
/// schedule run each operation is; and a restart never runs a nominal time twice.
extension StoreConformanceTests {
    /// Schedules keep their start and end in milliseconds (the API's precision).
    static let t0ms = Timestamp(nanoseconds: t0.nanoseconds / 1_000_000 * 1_000_000)

    static func scheduleSpec(_ name: String) -> ScheduleSpec {
        var t = OperationRequest(kind: "delay", name: "run of \(name)", queuePriority: .high, spec: .object([("seconds", .number(1))]))
        t.options = OperationOptions(
            timeout: 5, retry: RetryPolicy(maxAttempts: 3, backoff: 0.5, multiplier: 2), limits: [LimitRef(limiter: "l", key: "k \"q\"")], fairnessKey: "t")
        return ScheduleSpec(
            name: name, rule: .cron("30 2 * * *"), timezone: "Europe/Berlin", template: t, overlap: .bufferOne,
            catchup: Catchup(policy: .all, window: 7200, maxRuns: 7), jitter: 12.5, startAt: t0ms, endAt: t0ms.adding(seconds: 86_400 * 365))
    }

    @Test(arguments: StoreKind.durable)
    func schedulesSurviveCloseAndReopen(kind: StoreKind) throws {
        try StorePlace.with(kind) { place in
            var a = ScheduleSnapshot(queue: "q", spec: Self.scheduleSpec("nightly"), createdAt: t0, revision: 3)
            a.lastNominal = t0.adding(seconds: 60)
            a.lastRun = (t0.adding(seconds: 60), OperationID(raw: 7))
            a.runs = 4; a.skipped = 2; a.missed = 1
            a.isPaused = true
            a.pausedNote = "deploy \"quoted\" 🚀"
            var b = ScheduleSnapshot(queue: "q", spec: ScheduleSpec(name: "tick", rule: .every(10), template: OperationRequest(kind: "delay")), createdAt: t0)
            b.spec.catchup = Catchup(policy: .skip)
            var op = operationSnapshot(7)
            op.schedule = ScheduleTag(name: "nightly", nominalTime: t0.adding(seconds: 60))
            let store = try place.openDurable()
            store.append([.queue(queueSnapshot("q")), .schedule(a), .schedule(b), .operation(op), .scheduleDeleted(queue: "q", name: "tick")], upTo: 1)
            #expect(waitDurable(store, 1))
            store.close()
            let state = try place.openDurable().load()
            #expect(state.schedules.count == 1)
            let s = try #require(state.schedules.first)
            #expect(s.queue == "q" && s.spec.name == "nightly" && s.revision == 3 && s.isPaused && s.pausedNote == a.pausedNote)
            #expect(s.lastNominal == a.lastNominal && s.lastRun?.operation == OperationID(raw: 7) && s.runs == 4 && s.skipped == 2 && s.missed == 1)
            #expect(s.spec.rule == .cron("30 2 * * *") && s.spec.timezone == "Europe/Berlin" && s.spec.overlap == .bufferOne)
            #expect(s.spec.catchup == Catchup(policy: .all, window: 7200, maxRuns: 7) && s.spec.jitter == 12.5)
            #expect(s.spec.startAt == Self.t0ms && s.spec.endAt == Self.t0ms.adding(seconds: 86_400 * 365))
            #expect(s.spec.template.options == Self.scheduleSpec("x").template.options && s.spec.template.queuePriority == .high)
            #expect(state.operations.first?.schedule == op.schedule)
        }
    }

    /// The engine on the store: runs and the schedule's cursor are one commit, so after a
    /// restart no nominal time runs twice and the missed ones follow the catch-up policy.
    @Test(arguments: StoreKind.durable)
    func aRestartRunsNoNominalTimeTwice(kind: StoreKind) throws {
        try StorePlace.with(kind) { place in
            let clock = ManualClock()
            let store = try place.openDurable()
            let engine = QueueEngine(kinds: ["manual": HostTestKind()], store: store, clock: clock, scheduler: clock)
            try engine.createQueue(name: "q", maxConcurrentOperationCount: 100)
            let start = clock.now()
            try engine.createSchedule(
                in: "q",
                ScheduleSpec(
                    name: "tick", rule: .every(10), template: OperationRequest(kind: "manual"), overlap: .allow,
                    catchup: Catchup(policy: .all, window: 3600, maxRuns: 100), startAt: start))
            clock.advance(seconds: 30.1)
            #expect(try engine.operations(in: "q", limit: 100).operations.count == 3)
            #expect(waitDurable(engine))
            store.close()

            // Back 25 s later: 40 and 50 passed while it was stopped.
            clock.advance(seconds: 25)
            let store2 = try place.openDurable()
            let recovered = try store2.load()
            let engine2 = QueueEngine(kinds: ["manual": HostTestKind()], store: store2, clock: clock, scheduler: clock)
            engine2.restore(recovered)
            let nominals = try engine2.operations(in: "q", limit: 100).operations.compactMap { $0.schedule?.nominalTime }
            #expect(nominals == (1...5).map { start.adding(seconds: Double($0 * 10)) }, "10, 20, 30 before; 40 and 50 caught up; none twice")
            #expect(try engine2.schedule(in: "q", named: "tick").nextRunAt == start.adding(seconds: 60))
        }
    }
}
