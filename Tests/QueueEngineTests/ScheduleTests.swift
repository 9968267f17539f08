import QueueEngine
import Schedules
import Testing

/// Schedules in the engine, on a manual clock (API.md "Schedules").
extension Engine {
    @Suite struct Schedules {
        func every(_ name: String, _ seconds: Int64, overlap: Overlap = .skip, catchup: Catchup = Catchup(), startAt: Timestamp? = nil) -> ScheduleSpec {
            ScheduleSpec(
                name: name, rule: .every(seconds), template: OperationRequest(kind: "manual", name: name), overlap: overlap, catchup: catchup, startAt: startAt)
        }

        func runs(_ f: Fixture) throws -> [OperationSnapshot] {
            try f.engine.operations(in: "q", limit: 10_000).operations.filter { $0.schedule != nil }
        }

        @Test func runsComeAtTheirTimesEachCarryingItsScheduleAndNominalTime() throws {
            let f = Fixture()
            try f.queue("q", max: 100)
            let start = f.clock.now()
            let s = try f.engine.createSchedule(in: "q", every("tick", 10, overlap: .allow, startAt: start))
            #expect(s.nextRunAt == start.adding(seconds: 10))
            f.clock.advance(seconds: 9.9)
            #expect(try runs(f).isEmpty)
            f.clock.advance(seconds: 0.2)
            var all = try runs(f)
            #expect(all.count == 1 && all[0].schedule == ScheduleTag(name: "tick", nominalTime: start.adding(seconds: 10)))
            f.clock.advance(seconds: 30)
            all = try runs(f)
            #expect(all.map { $0.schedule?.nominalTime } == (1...4).map { start.adding(seconds: Double($0 * 10)) })
            let after = try f.engine.schedule(in: "q", named: "tick")
            #expect(after.runs == 4 && after.lastRun?.nominalTime == start.adding(seconds: 40) && after.lastNominal == start.adding(seconds: 40))
        }

        @Test func overlapPolicies() throws {
            let f = Fixture()
            try f.queue("q", max: 100)
            let start = f.clock.now()
            for p in Overlap.allCases { try f.engine.createSchedule(in: "q", every(p.rawValue, 10, overlap: p, startAt: start)) }
            // The manual kind's runs never finish by themselves: each later time finds the previous unfinished.
            f.clock.advance(seconds: 30.1)
            let all = try runs(f)
            func of(_ p: Overlap) -> [OperationSnapshot] { all.filter { $0.schedule?.name == p.rawValue } }
            #expect(of(.allow).count == 3 && of(.allow).allSatisfy { $0.state == .executing })
            let skip = try f.engine.schedule(in: "q", named: "skip")
            #expect(of(.skip).count == 1 && skip.skipped == 2)
            let one = of(.bufferOne)
            #expect(one.count == 2 && one[1].dependencies == [one[0].id], "one waits for the previous; the third time is skipped")
            #expect(try f.engine.schedule(in: "q", named: "bufferOne").skipped == 1)
            let chain = of(.bufferAll)
            #expect(chain.count == 3 && chain[1].dependencies == [chain[0].id] && chain[2].dependencies == [chain[1].id])
            let cancel = of(.cancelPrevious)
            #expect(cancel.count == 3 && cancel[0].isCancelled && cancel[1].isCancelled && !cancel[2].isCancelled)
        }

        @Test func pauseSkipsTheTimesThatPassAndResumeDoesNotCatchUp() throws {
            let f = Fixture()
            try f.queue("q", max: 100)
            let start = f.clock.now()
            try f.engine.createSchedule(in: "q", every("p", 10, overlap: .allow, startAt: start))
            f.clock.advance(seconds: 10.1)
            let paused = try f.engine.pauseSchedule(in: "q", named: "p", note: "deploy")
            #expect(paused.isPaused && paused.pausedNote == "deploy" && paused.nextRunAt == nil)
            f.clock.advance(seconds: 35)
            #expect(try runs(f).count == 1)
            let resumed = try f.engine.resumeSchedule(in: "q", named: "p")
            #expect(resumed.skipped == 3 && resumed.nextRunAt == start.adding(seconds: 50))
            f.clock.advance(seconds: 5)
            #expect(try runs(f).count == 2)
        }

        @Test func triggerAndBackfill() throws {
            let f = Fixture()
            try f.queue("q", max: 100)
            let start = f.clock.now()
            try f.engine.createSchedule(in: "q", every("b", 60, overlap: .skip, startAt: start.adding(seconds: -3600)))
            let now = f.clock.now()
            let triggered = try #require(try f.engine.triggerSchedule(in: "q", named: "b"))
            #expect(triggered.schedule?.nominalTime == now)
            #expect(try f.engine.triggerSchedule(in: "q", named: "b") == nil, "skip: the previous run is unfinished")
            #expect(try f.engine.triggerSchedule(in: "q", named: "b", overlap: .allow) != nil, "overridden for this trigger")
            let filled = try f.engine.backfillSchedule(in: "q", named: "b", from: start.adding(seconds: -600), to: start.adding(seconds: -300))
            #expect(filled.map { $0.schedule?.nominalTime } == [-600, -540, -480, -420, -360].map { start.adding(seconds: Double($0)) })
            #expect(filled[1].dependencies == [filled[0].id], "a chain by default")
            let again = try f.engine.backfillSchedule(in: "q", named: "b", from: start.adding(seconds: -600), to: start.adding(seconds: -240))
            #expect(again.map { $0.schedule?.nominalTime } == [start.adding(seconds: -300)], "times that have a run are left out")
            try f.engine.createSchedule(in: "q", every("fine", 1, startAt: start.adding(seconds: -7200)))
            #expect(throws: EngineError.self, "3,600 nominal times: more than 1,000") {
                try f.engine.backfillSchedule(in: "q", named: "fine", from: start.adding(seconds: -3600), to: start)
            }
        }

        @Test func aCronInAZoneWithJitter() throws {
            let f = Fixture()
            try f.queue("q", max: 100)
            var spec = ScheduleSpec(name: "nightly", rule: .cron("30 2 * * *"), timezone: "Europe/Berlin", template: OperationRequest(kind: "manual"))
            spec.jitter = 60
            let s = try f.engine.createSchedule(in: "q", spec)
            let next = try #require(s.nextRunAt)
            let (runs, _) = try f.engine.nextRuns(in: "q", named: "nightly", count: 3)
            #expect(runs.count == 3)
            let jitter = Double(next.nanoseconds - runs[0].nominalTime.nanoseconds) / 1e9
            #expect((0..<60).contains(jitter), "the same delay for every run, within jitter")
            #expect(runs.allSatisfy { ($0.nominalTime.nanoseconds / 1_000_000_000 + Int64($0.offset)) % 86_400 == 9000 }, "02:30 local")
            for (bad, field) in [("61 * * * *", "cron"), ("* * * *", "cron")] {
                spec.name = "x"
                spec.rule = .cron(bad)
                do { try f.engine.createSchedule(in: "q", spec); Issue.record("\(bad) accepted") } catch {
                    guard case let .invalidArgument(f, _) = error else { Issue.record("\(error)"); continue }
                    #expect(f == field)
                }
            }
            spec.rule = .cron("* * * * *")
            spec.timezone = "Mars/Olympus"
            do { try f.engine.createSchedule(in: "q", spec); Issue.record("a zone that does not exist accepted") } catch {
                #expect(
                    error
                        == .invalidArgument(
                            field: "timezone", detail: "'Mars/Olympus' is not a time zone of this server's tz database (an IANA name such as Europe/Berlin)"))
            }
        }

        @Test func aQueueWithSchedulesIsDeletedOnlyWithForce() throws {
            let f = Fixture()
            try f.queue("q", max: 100)
            try f.engine.createSchedule(in: "q", every("t", 10))
            #expect(throws: EngineError.self) { try f.engine.deleteQueue("q") }
            try f.engine.deleteQueue("q", force: true)
            #expect(f.engine.allSchedules().isEmpty)
            f.clock.advance(seconds: 30)
            try f.queue("q", max: 100)
            #expect(try f.engine.schedules(in: "q").isEmpty, "a queue made again under the name has none")
        }

        @Test func aRestartCatchesUpByTheSchedulesPolicy() throws {
            let clock = ManualClock()
            let kind = ManualKind()
            let engine = QueueEngine(kinds: ["manual": kind], store: InMemoryStore(), clock: clock, scheduler: clock)
            let now = clock.now()
            let q = QueueSnapshot(
                name: "q", maxConcurrentOperationCount: 100, effectiveMaxConcurrentOperationCount: 100, isSuspended: false, operationCount: 0,
                counts: [:], revision: 1, createdAt: Timestamp(nanoseconds: 0))
            func stored(_ name: String, _ policy: Catchup.Policy) -> ScheduleSnapshot {
                var s = ScheduleSnapshot(
                    queue: "q",
                    spec: ScheduleSpec(
                        name: name, rule: .every(60), template: OperationRequest(kind: "manual"), overlap: .allow,
                        catchup: Catchup(policy: policy, window: 600, maxRuns: 3), startAt: now.adding(seconds: -7200)),
                    createdAt: now.adding(seconds: -7200))
                s.lastNominal = now.adding(seconds: -3600)
                return s
            }
            var recovered = RecoveredState(queues: [q])
            recovered.schedules = [stored("skip", .skip), stored("latest", .latest), stored("all", .all)]
            engine.restore(recovered)
            let ops = try engine.operations(in: "q", limit: 100).operations
            func nominals(_ n: String) -> [Timestamp] { ops.filter { $0.schedule?.name == n }.compactMap { $0.schedule?.nominalTime } }
            #expect(nominals("skip").isEmpty)
            #expect(nominals("latest") == [now])
            #expect(nominals("all") == [now.adding(seconds: -120), now.adding(seconds: -60), now])
            #expect(try engine.schedule(in: "q", named: "all").missed == 57)
            #expect(try engine.schedule(in: "q", named: "skip").missed == 60)
            #expect(try engine.schedule(in: "q", named: "latest").lastNominal == now)
            clock.advance(seconds: 60.1)
            #expect(try engine.operations(in: "q", limit: 100).operations.filter { $0.schedule?.nominalTime == now.adding(seconds: 60) }.count == 3)
        }

        @Test func aCleanHandoverRunsEveryTimeThatPassedSinceTheCursorWhateverThePolicy() throws {
            let clock = ManualClock()
            let engine = QueueEngine(kinds: ["manual": ManualKind()], store: InMemoryStore(), clock: clock, scheduler: clock)
            // This instance runs; the queue comes to it 25 minutes later.
            let started = clock.now()
            clock.advance(seconds: 1500)
            let now = clock.now()
            func stored(_ queue: String, _ name: String, every: Int64, _ policy: Catchup.Policy, cursor: Timestamp, jitter: Double = 0) -> ScheduleSnapshot {
                var s = ScheduleSnapshot(
                    queue: queue,
                    spec: ScheduleSpec(
                        name: name, rule: .every(every), template: OperationRequest(kind: "manual"), overlap: .allow,
                        catchup: Catchup(policy: policy, window: 600, maxRuns: 3), jitter: jitter, startAt: started.adding(seconds: -7200)),
                    createdAt: started.adding(seconds: -7200))
                s.lastNominal = cursor
                return s
            }
            func queue(_ name: String) -> QueueSnapshot {
                QueueSnapshot(
                    name: name, maxConcurrentOperationCount: 100, effectiveMaxConcurrentOperationCount: 100, isSuspended: false, operationCount: 0,
                    counts: [:], revision: 1, createdAt: Timestamp(nanoseconds: 0))
            }
            var recovered = RecoveredState(queues: [queue("moved"), queue("crashed")])
            let cursor = now.adding(seconds: -30)
            recovered.schedules = [
                stored("moved", "skip", every: 5, .skip, cursor: cursor), stored("moved", "latest", every: 5, .latest, cursor: cursor),
                stored("moved", "all", every: 5, .all, cursor: cursor),
                // Its cursor is from before this instance started: those times may have passed
                // with the cluster stopped (the policy decides them), the later ones did not.
                stored("moved", "old", every: 60, .skip, cursor: started.adding(seconds: -3600)),
                // Far more times than a handover creates: the latest 1,000, the rest missed.
                stored("moved", "many", every: 1, .skip, cursor: started.adding(seconds: 100)),
                stored("moved", "jitter", every: 5, .skip, cursor: cursor, jitter: 4),
                stored("crashed", "skip", every: 5, .skip, cursor: cursor),
            ]
            recovered.handedOver = ["moved"]
            engine.restore(recovered)

            func nominals(_ queue: String, _ name: String) throws -> [Timestamp] {
                try engine.operations(in: queue, limit: 10_000).operations.filter { $0.schedule?.name == name }.compactMap { $0.schedule?.nominalTime }
            }
            let passed = (0..<6).map { now.adding(seconds: Double(-25 + 5 * $0)) }
            for name in ["skip", "latest", "all"] {
                #expect(try nominals("moved", name) == passed, "\(name)")
                let s = try engine.schedule(in: "moved", named: name)
                #expect(s.missed == 0 && s.lastNominal == now && s.nextRunAt == now.adding(seconds: 5), "\(name)")
            }
            #expect(try nominals("moved", "old") == (1...25).map { started.adding(seconds: Double(60 * $0)) })
            #expect(try engine.schedule(in: "moved", named: "old").missed == 60)
            let many = try nominals("moved", "many")
            #expect(many.count == 1000 && many.first == now.adding(seconds: -999) && many.last == now)
            #expect(try engine.schedule(in: "moved", named: "many").missed == 1400 - 1000)
            // A takeover after a crash: the policy.
            #expect(try nominals("crashed", "skip").isEmpty)
            #expect(try engine.schedule(in: "crashed", named: "skip").missed == 6)
            // Jitter: a time whose run is not due yet is planned, not run early.
            let jitter = Timing.jitterSeconds(queue: "moved", name: "jitter", jitter: 4)
            let early = try nominals("moved", "jitter")
            #expect(early.allSatisfy { $0.adding(seconds: jitter) <= now } && early.first == now.adding(seconds: -25))
            clock.advance(seconds: 9)
            let later = try nominals("moved", "jitter")
            #expect(later == (0..<7).map { now.adding(seconds: Double(-25 + 5 * $0)) }, "\(later) with jitter \(jitter)")
        }
    }
}
