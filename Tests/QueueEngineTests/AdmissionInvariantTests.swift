import Schedules
import Testing

@testable import QueueEngine

/// The engine's books, checked against its operations (for tests that move many things at once).
extension QueueEngine {
    func bookViolations() -> [String] {
        state.withLock { core in
            var out: [String] = []
            var keyWaiting: [ObjectIdentifier: Int] = [:]
            var keyRunning: [ObjectIdentifier: Int] = [:]
            var keyRefs: [ObjectIdentifier: Int] = [:]
            var hostWaiting: [String: Int] = [:]
            var hostRefs: [String: Int] = [:]
            for (name, q) in core.queues {
                var counts = [0, 0, 0, 0, 0]
                var unfinished = 0
                var notStartedDebounce: [String: [OpRecord]] = [:]
                for op in q.ops {
                    counts[op.state.index] += 1
                    let open = op.state != .finished
                    if open { unfinished += 1 }
                    if core.ops[op.id] !== op { out.append("\(name): op \(op.id) is not in the table") }
                    if op.state == .ready {
                        if op.parkedOn != nil {
                            if op.heapKey != 0 { out.append("\(name): op \(op.id) parked with a heap key") }
                        } else if op.heapKey == 0 {
                            out.append("\(name): ready op \(op.id) is neither parked nor in the ready order")
                        } else if let fair = q.fair {
                            let level = Int(op.heapKey >> 60)
                            if fair.levels[level].keys[op.options.fairnessKey ?? ""]?.heap.contains(op.heapKey) != true {
                                out.append("\(name): ready op \(op.id) has no entry under its fairness key")
                            }
                        } else if !q.heap.contains(op.heapKey) {
                            out.append("\(name): ready op \(op.id) has no heap entry")
                        }
                    } else if op.parkedOn != nil {
                        out.append("\(name): op \(op.id) is parked while \(op.state)")
                    }
                    if op.state == .pending && op.unfinishedDependencies == 0 && !op.waitingForTime {
                        out.append("\(name): op \(op.id) is pending with nothing to wait for")
                    }
                    if op.state == .pending, op.waitingForTime, let nb = op.options.notBefore,
                        nb.nanoseconds.saturatingAdd(5_000_000) < core.clock.now().nanoseconds
                    {
                        out.append("\(name): op \(op.id) still waits for its notBefore \(nb), which has passed")
                    }
                    if !open && (op.host != nil || !op.limitKeys.isEmpty) { out.append("\(name): finished op \(op.id) still holds flow") }
                    for k in op.limitKeys where open {
                        let id = ObjectIdentifier(k)
                        keyRefs[id, default: 0] += 1
                        if op.state == .ready { keyWaiting[id, default: 0] += 1 }
                        if op.state == .executing { keyRunning[id, default: 0] += 1 }
                        if k.limiter.keys[k.key] !== k { out.append("\(name): op \(op.id) names a key its limiter forgot: \(k.limiter.name)/\(k.key)") }
                    }
                    if let h = op.host, open {
                        hostRefs[h.name, default: 0] += 1
                        if op.state == .ready { hostWaiting[h.name, default: 0] += 1 }
                        if core.hosts[h.name] !== h { out.append("\(name): op \(op.id) names a host that is not tracked") }
                    }
                    if let tag = op.admission?.tag, open {
                        switch tag.mode {
                        case .debounce:
                            if !op.hasStarted && op.state != .executing { notStartedDebounce[tag.key, default: []].append(op) }
                        case .singleton:
                            if q.admission?.singleton[tag.key]?.contains(where: { $0 === op }) != true {
                                out.append("\(name): singleton op \(op.id) is missing from the index")
                            }
                        }
                    }
                }
                if counts != q.counts { out.append("\(name): counts \(q.counts), actual \(counts)") }
                if unfinished != q.unfinished { out.append("\(name): unfinished \(q.unfinished), actual \(unfinished)") }
                if q.executing != counts[2] { out.append("\(name): executing \(q.executing), actual \(counts[2])") }
                for (key, list) in notStartedDebounce {
                    if list.count > 1 { out.append("\(name): debounce key \(key) has \(list.count) operations not started") }
                    if let op = list.last, q.admission?.debounce[key] !== op {
                        out.append("\(name): debounce key \(key) does not name its operation not started (\(op.id))")
                    }
                }
                if let index = q.admission {
                    for (key, op) in index.debounce where op.state == .finished || op.queue !== q {
                        out.append("\(name): debounce key \(key) names a finished op \(op.id)")
                    }
                    for (key, list) in index.singleton {
                        for op in list where op.state == .finished || op.queue !== q {
                            out.append("\(name): singleton key \(key) names a finished op \(op.id)")
                        }
                    }
                }
            }
            for (_, l) in core.limiters {
                var w = 0, r = 0, refs = 0
                for (_, k) in l.keys {
                    let id = ObjectIdentifier(k)
                    if k.waiting != keyWaiting[id, default: 0] {
                        out.append("key \(l.name)/\(k.key): waiting \(k.waiting), actual \(keyWaiting[id, default: 0])")
                    }
                    if k.running != keyRunning[id, default: 0] {
                        out.append("key \(l.name)/\(k.key): running \(k.running), actual \(keyRunning[id, default: 0])")
                    }
                    if k.refs != keyRefs[id, default: 0] { out.append("key \(l.name)/\(k.key): refs \(k.refs), actual \(keyRefs[id, default: 0])") }
                    w += k.waiting; r += k.running; refs += k.refs
                }
                if l.waiting != w || l.running != r || l.refs != refs {
                    out.append("limiter \(l.name): waiting/running/refs \(l.waiting)/\(l.running)/\(l.refs), keys say \(w)/\(r)/\(refs)")
                }
            }
            for (name, h) in core.hosts {
                if h.waiting != hostWaiting[name, default: 0] { out.append("host \(name): waiting \(h.waiting), actual \(hostWaiting[name, default: 0])") }
                if h.refs != hostRefs[name, default: 0] { out.append("host \(name): refs \(h.refs), actual \(hostRefs[name, default: 0])") }
            }
            return out
        }
    }
}

extension Engine {
    /// Admission mixed with everything else that moves an operation (pause, cancel, limiters,
    /// hosts, fairness, suspend), checking the engine's books after every step, and at the end
    /// that nothing is stuck.
    @Suite struct AdmissionInvariants {
        @Test(arguments: 0..<60) func randomStepsKeepTheBooks(seed: Int) throws {
            var rng = SplitMix(state: UInt64(seed) &* 7919 &+ 1)
            let hostKind = HostKind()
            let otherKind = HostKind()
            let clock = ManualClock()
            var c = EngineConfiguration()
            c.breaker = BreakerSettings(failures: 2, openSeconds: 2, maxOpenSeconds: 4)
            let engine = QueueEngine(kinds: ["host": hostKind, "other": otherKind], store: InMemoryStore(), clock: clock, scheduler: clock, configuration: c)
            func kind(_ id: OperationID) -> HostKind { (try? engine.operation(id).kind) == "other" ? otherKind : hostKind }
            try engine.createQueue(name: "q", maxConcurrentOperationCount: 2)
            try engine.createQueue(name: "r", maxConcurrentOperationCount: 1)
            try engine.createLimiter(name: "L", settings: LimiterSettings(concurrency: 1))
            try engine.createLimiter(name: "M", settings: LimiterSettings(rate: RateLimit(perSecond: 1, burst: 1)))
            var ids: [OperationID] = []
            var log: [String] = []
            func addSchedule(_ queue: String) {
                var template = OperationRequest(kind: "host", spec: .object([("host", .string("a:80"))]))
                template.admission =
                    [
                        .debounce(key: "d1", seconds: 1, maxSeconds: 3), .singleton(key: "s1", mode: .skip),
                        .singleton(key: "s2", mode: .replaceWaiting),
                    ][Int.random(in: 0..<3, using: &rng)]
                let overlap = Overlap.allCases.randomElement(using: &rng)!
                _ = try? engine.createSchedule(
                    in: queue,
                    ScheduleSpec(name: "n", rule: .every(Int64.random(in: 1...3, using: &rng)), template: template, overlap: overlap, startAt: clock.now()))
            }
            addSchedule("q")
            addSchedule("r")

            func request() -> OperationRequest {
                var r = OperationRequest(
                    kind: Int.random(in: 0..<12, using: &rng) == 0 ? "other" : "host",
                    queuePriority: [.normal, .high, .low].randomElement(using: &rng)!,
                    spec: .object([("host", .string(["a:80", "b:80", "c:80"].randomElement(using: &rng)!))]))
                switch Int.random(in: 0..<4, using: &rng) {
                case 0: r.options.limits = [LimitRef(limiter: "L", key: ["x", "y"].randomElement(using: &rng)!)]
                case 1: r.options.limits = [LimitRef(limiter: "M", key: "z")]
                default: break
                }
                r.options.fairnessKey = [nil, "f", "g"].randomElement(using: &rng)!
                if Int.random(in: 0..<4, using: &rng) == 0 {
                    r.options.notBefore = clock.now().adding(seconds: Double.random(in: 0...4, using: &rng))
                }
                switch Int.random(in: 0..<5, using: &rng) {
                case 0, 1:
                    let s = Double.random(in: 0.2...3, using: &rng)
                    r.admission = .debounce(key: ["d1", "d2"].randomElement(using: &rng)!, seconds: s, maxSeconds: s * Double.random(in: 1...5, using: &rng))
                case 2:
                    r.admission = .singleton(key: ["s1", "s2"].randomElement(using: &rng)!, mode: .skip)
                case 3:
                    r.admission = .singleton(key: ["s1", "s2"].randomElement(using: &rng)!, mode: .replaceWaiting)
                default:
                    break
                }
                return r
            }

            for step in 0..<400 {
                let pick = ids.isEmpty ? nil : ids.randomElement(using: &rng)
                let queue = Int.random(in: 0..<4, using: &rng) == 0 ? "r" : "q"
                switch Int.random(in: 0..<17, using: &rng) {
                case 0, 1, 2, 3:
                    let r = request()
                    log.append("\(step) admit \(queue) \(String(describing: r.admission))")
                    if let made = try? engine.admitOperation(to: queue, r) { ids.append(made.operation.id) }
                case 4:
                    let n = Int.random(in: 1...4, using: &rng)
                    let elements = (0..<n).map { i in
                        BatchElement(
                            queue: queue, request: request(),
                            dependencies: i > 0 && Bool.random(using: &rng) ? [.element(Int.random(in: 0..<i, using: &rng))] : [])
                    }
                    log.append("\(step) batch \(queue) \(elements.map { String(describing: $0.request.admission) })")
                    if let made = try? engine.admitOperations(elements) { ids.append(contentsOf: made.map(\.operation.id)) }
                case 5:
                    if let pick { log.append("\(step) pause \(pick)"); _ = try? engine.pause(pick) }
                case 6:
                    if let pick { log.append("\(step) resume \(pick)"); _ = try? engine.resume(pick) }
                case 7:
                    if let pick { log.append("\(step) cancel \(pick)"); _ = try? engine.cancel(pick) }
                case 8, 9:
                    if let pick, (try? engine.operation(pick).state) == .executing {
                        switch Int.random(in: 0..<4, using: &rng) {
                        case 0: kind(pick).fail(pick)
                        case 1: kind(pick).throttle(pick, after: Double.random(in: 0...2, using: &rng))
                        default: kind(pick).succeed(pick)
                        }
                        log.append("\(step) finish \(pick)")
                    }
                case 10, 11:
                    let s = Double.random(in: 0...2, using: &rng)
                    log.append("\(step) advance \(s)")
                    clock.advance(seconds: s)
                case 12:
                    log.append("\(step) suspend/resume \(queue)")
                    if (try? engine.queue(named: queue).isSuspended) == true { _ = try? engine.resumeQueue(queue) } else { _ = try? engine.suspend(queue) }
                case 13:
                    if let pick {
                        log.append("\(step) priority \(pick)")
                        _ = try? engine.update(pick, queuePriority: [.veryHigh, .low].randomElement(using: &rng)!)
                    }
                case 14:
                    let n = Int.random(in: 1...2, using: &rng)
                    log.append("\(step) limiter L \(n)")
                    _ = try? engine.updateLimiter("L", concurrency: .some(n))
                case 15:
                    switch Int.random(in: 0..<6, using: &rng) {
                    case 0:
                        log.append("\(step) delete+recreate \(queue)")
                        _ = try? engine.deleteQueue(queue, force: true)
                        _ = try? engine.createQueue(name: queue, maxConcurrentOperationCount: 2)
                        addSchedule(queue)
                    case 1:
                        log.append("\(step) cancel-all \(queue)")
                        _ = try? engine.cancelAll(queue)
                    case 2:
                        log.append("\(step) purge")
                        _ = engine.purgeFinished(before: clock.now())
                    default:
                        log.append("\(step) trigger \(queue)")
                        if let made = try? engine.triggerScheduleAdmitted(in: queue, named: "n") { ids.append(made.operation.id) }
                    }
                default:
                    if let pick {
                        log.append("\(step) deps \(pick)")
                        _ = try? engine.update(pick, dependencies: [])
                    }
                }
                let bad = engine.bookViolations()
                if !bad.isEmpty {
                    Issue.record("seed \(seed), after step \(step): \(bad)\n\(log.suffix(12).joined(separator: "\n"))")
                    return
                }
            }
            // Nothing is stuck: with every hold lifted, everything finishes.
            _ = try engine.resumeQueue("q")
            _ = try engine.resumeQueue("r")
            _ = try? engine.pauseSchedule(in: "q", named: "n", note: nil)
            _ = try? engine.pauseSchedule(in: "r", named: "n", note: nil)
            _ = try engine.updateLimiter("L", concurrency: .some(100))
            for _ in 0..<60 {
                // Every operation, those the schedules made too.
                for queue in ["q", "r"] {
                    if let page = try? engine.operations(in: queue, limit: 100_000) { ids.append(contentsOf: page.operations.map(\.id)) }
                }
                ids = Array(Set(ids))
                for id in ids { if (try? engine.operation(id).state) == .paused { _ = try? engine.resume(id) } }
                for id in ids where (try? engine.operation(id).state) == .executing { kind(id).succeed(id) }
                clock.advance(seconds: 5)
            }
            // Purged or gone with a deleted queue: finished.
            let left = Set(ids).filter { id in (try? engine.operation(id).state).map { $0 != .finished } ?? false }.sorted { $0.raw < $1.raw }
            let why = left.prefix(5).map { id in
                "\(id): \(String(describing: try? engine.operation(id).state)) \(String(describing: try? engine.operation(id).waitingOn))"
            }
            #expect(left.isEmpty, "seed \(seed): stuck \(why)\n\(log.suffix(20).joined(separator: "\n"))")
            #expect(engine.bookViolations().isEmpty)
        }
    }
}
