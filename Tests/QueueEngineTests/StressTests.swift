import Dispatch
import Foundation
import QueueEngine
import Testing

/// Work that ends on a background queue after a tiny random delay; a cancel ends it at once.
/// A pause does not stop the timer, so some work ends while its operation is paused (the
/// engine keeps that completion for the resume).
private final class BackgroundKind: OperationKind {
    let starts = Locked(0)
    let resumes = Locked(0)
    /// Private serial queues (their threads come from libdispatch's overcommit pool), so that
    /// thousands of timers do not flood the shared pool other work depends on.
    private let timers = (0..<4).map { DispatchQueue(label: "stress-kind-\($0)") }

    func start(_ context: ExecutionContext) {
        starts.withLock { $0 += 1 }
        if context.isResume { resumes.withLock { $0 += 1 } }
        // Mostly a few hundred microseconds; one in twenty runs for 2 ms, long enough to be
        // paused and resumed mid-run.
        let micros = Int.random(in: 0..<20) == 0 ? 2_000 : Int.random(in: 0...300)
        timers[micros % timers.count].asyncAfter(deadline: .now() + .microseconds(micros)) {
            context.finish(micros % 10 == 0 ? .failed(type: "random", detail: "one in ten fails") : .succeeded(.null))
        }
    }

    func cancel(_ context: ExecutionContext) { context.finish(.failed(type: "stopped", detail: "cancelled")) }
    func pause(_ context: ExecutionContext) {}
}

/// What the global observer checks as changes arrive, in `seq` order.
private struct FeedCheck: Sendable {
    var lastSeq: UInt64 = 0
    var outOfOrder = 0
    var events = 0
    var finishedEvents: [OperationID: Int] = [:]
    var finishSeq: [OperationID: UInt64] = [:]
    var firstStartSeq: [OperationID: UInt64] = [:]
    /// Executing operations per queue, from isExecuting changes.
    var executing: [String: Int] = [:]
    var peak: [String: Int] = [:]
    var overLimit: [String] = []
    /// Executing operations that were paused (isExecuting true -> false, now paused).
    var pausedMidRun = 0
}

/// A small deterministic generator, one per thread (and one per seeded walk).
struct SplitMix: RandomNumberGenerator {
    var state: UInt64
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

extension Engine {
    @Suite("Stress")
    struct StressTests {
        @Test("eight threads adding, cancelling, pausing and resuming at random lose nothing and break no limit")
        func randomActions() throws {
            let limits = ["s1": 1, "s2": 2, "s3": 3]
            let queueNames = limits.keys.sorted()
            let kind = BackgroundKind()
            let engine = QueueEngine(kinds: ["work": kind], store: InMemoryStore(), clock: SystemClock())
            for (name, limit) in limits { try engine.createQueue(name: name, maxConcurrentOperationCount: limit) }

            let feed = Locked(FeedCheck())
            let token = engine.observeAll { batch in
                feed.withLock { c in
                    for e in batch {
                        c.events += 1
                        if e.seq != c.lastSeq + 1 { c.outOfOrder += 1 }
                        c.lastSeq = e.seq
                        switch (e.key, e.new) {
                        case (.isFinished, .bool(true)):
                            c.finishedEvents[e.operation, default: 0] += 1
                            c.finishSeq[e.operation] = e.seq
                        case (.isExecuting, .bool(true)):
                            if c.firstStartSeq[e.operation] == nil { c.firstStartSeq[e.operation] = e.seq }
                            let n = c.executing[e.queue, default: 0] + 1
                            c.executing[e.queue] = n
                            c.peak[e.queue] = max(c.peak[e.queue] ?? 0, n)
                            if n > limits[e.queue]! { c.overLimit.append("\(e.queue): \(n) executing at seq \(e.seq)") }
                        case (.isExecuting, .bool(false)):
                            c.executing[e.queue, default: 0] -= 1
                            if e.state == .paused { c.pausedMidRun += 1 }
                        default:
                            break
                        }
                    }
                }
            }
            defer { engine.removeObserver(token) }

            let threads = 8
            // 20k actions; a sixth of that under ThreadSanitizer, which is ten times slower.
            let actionsPerThread = isThreadSanitizerActive ? 400 : 2_500
            let added = Locked<[OperationID]>([])
            let paused = Locked<[OperationID]>([])
            let unexpected = Locked<[String]>([])
            let counts = Locked<[String: Int]>([:])
            let recent: @Sendable (inout SplitMix) -> OperationID? = { rng in
                added.withLock { ids in
                    guard !ids.isEmpty else { return nil }
                    let window = min(ids.count, 64)
                    return ids[ids.count - 1 - Int(rng.next() % UInt64(window))]
                }
            }

            let t0 = monotonicMillis()
            let group = DispatchGroup()
            for t in 0..<threads {
                group.enter()
                let thread = Thread {
                    var rng = SplitMix(state: UInt64(t + 1) &* 0x1234_5678_9ABC_DEF1)
                    var mine: [String: Int] = [:]
                    for _ in 0..<actionsPerThread {
                        let roll = rng.next() % 100
                        let queue = queueNames[Int(rng.next() % 3)]
                        do {
                            switch roll {
                            case 0..<45:
                                var deps: [OperationID] = []
                                if rng.next() % 10 < 4 {
                                    for _ in 0..<(1 + Int(rng.next() % 2)) { if let d = recent(&rng) { deps.append(d) } }
                                }
                                let priority = QueuePriority.allCases[Int(rng.next() % 5)]
                                let id = try engine.addOperationID(to: queue, OperationRequest(kind: "work", queuePriority: priority, dependencies: deps))
                                added.withLock { $0.append(id) }
                                mine["add", default: 0] += 1
                            case 45..<60:
                                guard let id = recent(&rng) else { continue }
                                do {
                                    try engine.cancel(id, cascade: rng.next() % 10 < 3)
                                    mine["cancel", default: 0] += 1
                                } catch EngineError.invalidTransition(from: .finished, action: .cancel) {}
                            case 60..<75:
                                guard let id = recent(&rng) else { continue }
                                do {
                                    try engine.pause(id)
                                    paused.withLock { $0.append(id) }
                                    mine["pause", default: 0] += 1
                                } catch EngineError.invalidTransition(from: .paused, action: .pause) {
                                } catch EngineError.invalidTransition(from: .finished, action: .pause) {}
                            case 75..<90:
                                // Mostly something this run paused, else any recent operation.
                                let pick = paused.withLock { p -> OperationID? in
                                    p.isEmpty || rng.next() % 4 == 0 ? nil : p.remove(at: Int(rng.next() % UInt64(p.count)))
                                }
                                guard let id = pick ?? recent(&rng) else { continue }
                                do {
                                    try engine.resume(id)
                                    mine["resume", default: 0] += 1
                                } catch EngineError.invalidTransition(from: _, action: .resume) {}
                            case 90..<96:
                                guard let id = recent(&rng) else { continue }
                                do {
                                    try engine.update(id, queuePriority: QueuePriority.allCases[Int(rng.next() % 5)])
                                    mine["priority", default: 0] += 1
                                } catch EngineError.alreadyStarted {}
                            case 96..<98:
                                try engine.updateQueue(queue, isSuspended: rng.next() % 2 == 0)
                                mine["suspend/resume queue", default: 0] += 1
                            default:
                                let id = try engine.addBarrier(to: queue).id
                                added.withLock { $0.append(id) }
                                mine["barrier", default: 0] += 1
                            }
                        } catch {
                            unexpected.withLock { $0.append("\(error)") }
                        }
                    }
                    counts.withLock { c in for (k, v) in mine { c[k, default: 0] += v } }
                    group.leave()
                }
                thread.start()
            }
            #expect(group.wait(timeout: .now() + 60) == .success, "the threads did not finish their actions")
            let actionsMillis = monotonicMillis() - t0

            // Let everything run to the end.
            for name in queueNames { try engine.resumeQueue(name) }
            let ids = added.value
            for id in ids {
                if try engine.operation(id).state == .paused { try engine.resume(id) }
            }
            let drained = waitUntil(timeout: 30) { queueNames.allSatisfy { (try? engine.queue(named: $0).operationCount) == 0 } }
            #expect(drained, "queues did not drain: \(engine.queues().map { "\($0.name): \($0.counts)" })")
            #expect(waitUntil { feed.value.lastSeq + 1 == engine.nextSequence }, "every change reaches the observer")
            let totalMillis = monotonicMillis() - t0

            #expect(unexpected.value.isEmpty, "unexpected refusals: \(Array(unexpected.value.prefix(10)))")
            let check = feed.value
            #expect(check.outOfOrder == 0, "seq must only grow, by one per change")
            #expect(check.overLimit.isEmpty, "limits exceeded: \(Array(check.overLimit.prefix(10)))")
            for name in queueNames { #expect(check.peak[name, default: 0] <= limits[name]!) }
            #expect(check.executing.values.allSatisfy { $0 == 0 }, "nothing is left executing: \(check.executing)")

            var lost: [String] = [], finishedTwice: [String] = [], startedEarly: [String] = []
            for id in ids {
                let s = try engine.operation(id)
                if s.state != .finished { lost.append("\(id) \(s.state)") }
                let n = check.finishedEvents[id, default: 0]
                if n != 1 { finishedTwice.append("\(id): \(n) isFinished events") }
                if let started = check.firstStartSeq[id] {
                    for dep in s.dependencies where (check.finishSeq[dep] ?? .max) > started {
                        startedEarly.append("\(id) started at seq \(started) before its dependency \(dep) finished")
                    }
                }
            }
            #expect(lost.isEmpty, "\(lost.count) operations did not finish: \(Array(lost.prefix(10)))")
            #expect(finishedTwice.isEmpty, "\(Array(finishedTwice.prefix(10)))")
            #expect(startedEarly.isEmpty, "\(Array(startedEarly.prefix(10)))")
            #expect(ids.count > threads * actionsPerThread * 4 / 10, "about 45% of the actions add")
            // How many pauses land on a running operation depends on thread timing (some runs
            // get none), so it is reported below rather than asserted; PauseResumeTests covers
            // pausing an executing operation deterministically.

            let summary = counts.value.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", ")
            print(
                "stress\(isThreadSanitizerActive ? " (under TSan)" : ""): \(threads * actionsPerThread) actions (\(summary)) in \(Int(actionsMillis)) ms, drained after \(Int(totalMillis)) ms; \(check.events) events, peaks \(check.peak), \(check.pausedMidRun) paused mid-run, \(kind.starts.value) kind starts, \(kind.resumes.value) resumed starts"
            )
        }
    }
}
