import Dispatch
import Foundation
import QueueEngine
import Testing

// The same scenario, step by step, through Foundation's `OperationQueue` and through the
// engine. Operations are "held": their work runs until a `.finish` step lets it end, so the
// test decides when each one ends, and after every step we record which operations started.

/// One step of a scenario. Names are the test's labels for queues and operations.
enum Step: CustomStringConvertible {
    case queue(String, max: Int, suspended: Bool = false)
    /// `held: false` makes the work end as soon as it starts.
    case add(String, to: String, priority: QueuePriority = .normal, after: [String] = [], held: Bool = true)
    case barrier(String, to: String)
    /// Lets the held work of an operation end.
    case finish(String)
    case cancel(String)
    case cancelAll(String)
    /// Bulk cancel of a queue's unfinished operations whose name starts with `prefix`
    /// (Foundation: `cancel()` on each of them).
    case cancelMatching(String, prefix: String)
    case suspend(String)
    case resume(String)
    case priority(String, QueuePriority)

    var description: String {
        switch self {
        case let .queue(n, m, s): return "queue \(n) max \(m)\(s ? " suspended" : "")"
        case let .add(n, q, p, deps, held):
            return "add \(n) to \(q)\(p == .normal ? "" : " \(p.name)")\(deps.isEmpty ? "" : " after \(deps)")\(held ? "" : " (immediate)")"
        case let .barrier(n, q): return "barrier \(n) on \(q)"
        case let .finish(n): return "finish \(n)"
        case let .cancel(n): return "cancel \(n)"
        case let .cancelAll(q): return "cancelAll \(q)"
        case let .cancelMatching(q, p): return "cancel \(q) \(p)*"
        case let .suspend(q): return "suspend \(q)"
        case let .resume(q): return "resume \(q)"
        case let .priority(n, p): return "priority \(n) \(p.name)"
        }
    }
}

/// How an operation ended, in terms both sides can report.
struct Outcome: Equatable, Sendable, CustomStringConvertible {
    /// Its work started (Foundation: its block ran).
    var ran: Bool
    var cancelled: Bool
    var finished: Bool
    var description: String { "ran: \(ran), cancelled: \(cancelled), finished: \(finished)" }
}

/// What a run of a scenario produced.
struct Trace: Equatable {
    /// Per step (plus a last one for the clean-up): what started during it, as `queue:name`.
    /// Within a step, starts on a serial queue keep their order; on other queues they are
    /// sorted, because two operations dispatched together may begin in either order.
    var steps: [[String]] = []
    /// Every start, in the order recorded.
    var order: [String] = []
    var outcomes: [String: Outcome] = [:]
    /// The most operations (barriers excluded) that were running at once, per queue.
    var maxRunning: [String: Int] = [:]

    func index(of name: String) -> Int? { order.firstIndex(of: name) }
}

/// Starts and ends of work, from any thread.
final class StartLog: Sendable {
    struct State: Sendable {
        var starts: [(queue: String, name: String)] = []
        var running: [String: Int] = [:]
        var maxRunning: [String: Int] = [:]
    }
    private let state = Locked(State())

    func started(_ name: String, queue: String, counts: Bool = true) {
        state.withLock { s in
            s.starts.append((queue, name))
            if counts {
                s.running[queue, default: 0] += 1
                s.maxRunning[queue] = max(s.maxRunning[queue] ?? 0, s.running[queue]!)
            }
        }
    }

    func ended(queue: String) { state.withLock { $0.running[queue, default: 0] -= 1 } }

    var count: Int { state.withLock { $0.starts.count } }
    var starts: [(queue: String, name: String)] { state.withLock { $0.starts } }
    var maxRunning: [String: Int] { state.withLock { $0.maxRunning } }
}

/// Groups one step's starts by queue (sorted), keeping start order on serial queues only.
private func normalize(_ starts: ArraySlice<(queue: String, name: String)>, serial: Set<String>) -> [String] {
    let byQueue = Dictionary(grouping: starts, by: \.queue)
    return byQueue.keys.sorted().flatMap { q -> [String] in
        let names = byQueue[q]!.map(\.name)
        return (serial.contains(q) ? names : names.sorted()).map { "\(q):\($0)" }
    }
}

private func serialQueues(_ steps: [Step]) -> Set<String> {
    Set(steps.compactMap { if case let .queue(n, 1, _) = $0 { return n } else { return nil } })
}

// MARK: - the engine side

/// Records starts and holds the work until the scenario finishes it. The spec is
/// `[name, held]`.
final class ScenarioKind: OperationKind {
    let log: StartLog
    private let held = Locked<[String: ExecutionContext]>([:])
    init(log: StartLog) { self.log = log }

    func start(_ context: ExecutionContext) {
        guard case let .array(spec) = context.spec, case let .string(name) = spec[0], case let .bool(isHeld) = spec[1] else {
            Issue.record("bad spec \(String(describing: context.spec))")
            return
        }
        log.started(name, queue: context.queue)
        if isHeld {
            held.withLock { $0[name] = context }
        } else {
            log.ended(queue: context.queue)
            context.finish(.succeeded(.null))
        }
    }

    func cancel(_ context: ExecutionContext) {}
    func pause(_ context: ExecutionContext) {}

    /// Ends the held work of `name`; false when it is not running.
    @discardableResult
    func finish(_ name: String) -> Bool {
        guard let context = held.withLock({ $0.removeValue(forKey: name) }) else { return false }
        log.ended(queue: context.queue)
        context.finish(.succeeded(.null))
        return true
    }

    var heldNames: [String] { held.withLock { Array($0.keys) } }
}

/// Runs `steps` through the engine. Also returns, per step, how many starts had been
/// recorded by its end (Foundation's side waits for that many before looking).
func runEngine(_ steps: [Step]) throws -> (trace: Trace, startsAfterStep: [Int]) {
    let kindLog = StartLog()
    let kind = ScenarioKind(log: kindLog)
    let engine = QueueEngine(kinds: ["scenario": kind], store: InMemoryStore(), clock: ManualClock())
    var ids: [String: OperationID] = [:]
    // The start order is taken from the change feed (isExecuting -> true), which also shows
    // barriers (they have no kind of ours). A barrier on an idle queue runs inside
    // addBarrier, before its id is known, so names are looked up only after each step.
    let executing = Locked<[(id: OperationID, queue: String)]>([])
    let delivered = Locked<UInt64>(0)
    let observer = engine.observeAll { batch in
        if let last = batch.last { delivered.withLock { $0 = last.seq } }
        for e in batch where e.key == .isExecuting && e.new == .bool(true) {
            executing.withLock { $0.append((e.operation, e.queue)) }
        }
    }
    defer { engine.removeObserver(observer) }

    let serial = serialQueues(steps)
    var trace = Trace()
    var startsAfterStep: [Int] = []
    var seen = 0
    var names: [OperationID: String] = [:]
    func starts() -> [(queue: String, name: String)] {
        executing.value.map { ($0.queue, names[$0.id] ?? "?\($0.id)") }
    }
    func closeStep() {
        #expect(waitUntil { delivered.value + 1 >= engine.nextSequence }, "every change was reported")
        names = Dictionary(uniqueKeysWithValues: ids.map { ($1, $0) })
        let all = starts()
        trace.steps.append(normalize(all[seen...], serial: serial))
        seen = all.count
        startsAfterStep.append(seen)
    }

    for step in steps {
        switch step {
        case let .queue(name, max, suspended):
            try engine.createQueue(name: name, maxConcurrentOperationCount: max, isSuspended: suspended)
        case let .add(name, queue, priority, after, held):
            ids[name] = try engine.addOperationID(
                to: queue,
                OperationRequest(
                    kind: "scenario", name: name, queuePriority: priority, dependencies: after.map { ids[$0]! },
                    spec: .array([.string(name), .bool(held)])))
        case let .barrier(name, queue):
            ids[name] = try engine.addBarrier(to: queue, name: name).id
        case let .finish(name):
            #expect(kind.finish(name), "engine: \(name) was not running when the scenario finished it")
        case let .cancel(name):
            try engine.cancel(ids[name]!)
        case let .cancelAll(queue):
            try engine.cancelAll(queue)
        case let .cancelMatching(queue, prefix):
            try engine.cancelOperations(in: queue, matching: OperationFilter(namePrefix: prefix))
        case let .suspend(queue):
            try engine.suspend(queue)
        case let .resume(queue):
            try engine.resumeQueue(queue)
        case let .priority(name, priority):
            try engine.update(ids[name]!, queuePriority: priority)
        }
        closeStep()
    }

    // Clean-up: resume suspended queues and end whatever still holds, so everything finishes.
    for q in engine.queues() where q.isSuspended { try engine.resumeQueue(q.name) }
    var rounds = 0
    while let name = kind.heldNames.first, rounds < 1000 {
        kind.finish(name)
        rounds += 1
    }
    closeStep()

    let all = starts()
    let kindRan = Set(kindLog.starts.map(\.name))
    let executed = Set(all.map(\.name))
    for (name, id) in ids {
        let s = try engine.operation(id)
        let ran = s.kind == "barrier" ? executed.contains(name) : kindRan.contains(name)
        trace.outcomes[name] = Outcome(ran: ran, cancelled: s.isCancelled, finished: s.isFinished)
    }
    trace.order = all.map(\.name)
    trace.maxRunning = kindLog.maxRunning
    return (trace, startsAfterStep)
}

// MARK: - the Foundation side

/// Lets a non-Sendable Foundation object cross into a closure that runs elsewhere.
struct Unchecked<T>: @unchecked Sendable { let value: T }

/// Runs `steps` through Foundation's `OperationQueue`. After each step it waits until at least
/// as many starts as the engine made have happened (so a correct run is fast), then a little
/// longer so that extra starts show up too.
func runFoundation(_ steps: [Step], startsAfterStep hints: [Int], settle: Double = 0.015) -> Trace {
    let log = StartLog()
    var queues: [String: OperationQueue] = [:]
    // Every operation stays referenced until its queue is idle: corelibs-foundation on Linux
    // uses freed memory when a cancelled pending operation is released while its dependency runs.
    var ops: [String: BlockOperation] = [:]
    var gates: [String: DispatchSemaphore] = [:]
    var opQueues: [String: String] = [:]
    var barrierNames: [String] = []
    let serial = serialQueues(steps)
    var trace = Trace()
    var seen = 0

    func closeStep(expecting hint: Int?) {
        if let hint { waitUntil(timeout: 5) { log.count >= hint } }
        usleep(UInt32(settle * 1e6))
        let starts = log.starts
        trace.steps.append(normalize(starts[seen...], serial: serial))
        seen = starts.count
    }

    for (i, step) in steps.enumerated() {
        switch step {
        case let .queue(name, max, suspended):
            let q = OperationQueue()
            q.name = name
            q.maxConcurrentOperationCount = max
            q.isSuspended = suspended
            queues[name] = q
        case let .add(name, queue, priority, after, held):
            let gate = DispatchSemaphore(value: 0)
            let op = BlockOperation {
                log.started(name, queue: queue)
                if held { gate.wait() }
                log.ended(queue: queue)
            }
            op.queuePriority = Operation.QueuePriority(rawValue: priority.rawValue)!
            for d in after { op.addDependency(ops[d]!) }
            ops[name] = op
            opQueues[name] = queue
            gates[name] = gate
            queues[queue]!.addOperation(op)
        case let .barrier(name, queue):
            barrierNames.append(name)
            queues[queue]!.addBarrierBlock { log.started(name, queue: queue, counts: false) }
        case let .finish(name):
            gates[name]!.signal()
            let op = Unchecked(value: ops[name]!)
            #expect(waitUntil(timeout: 2) { op.value.isFinished }, "Foundation: \(name) did not finish")
        case let .cancel(name):
            ops[name]!.cancel()
        case let .cancelAll(queue):
            queues[queue]!.cancelAllOperations()
        case let .cancelMatching(queue, prefix):
            for (name, op) in ops where name.hasPrefix(prefix) && opQueues[name] == queue && !op.isFinished { op.cancel() }
        case let .suspend(queue):
            queues[queue]!.isSuspended = true
        case let .resume(queue):
            queues[queue]!.isSuspended = false
        case let .priority(name, priority):
            ops[name]!.queuePriority = Operation.QueuePriority(rawValue: priority.rawValue)!
        }
        closeStep(expecting: i < hints.count ? hints[i] : nil)
    }

    // Clean-up, as on the engine side: resume, let every held block end, wait until idle.
    for q in queues.values { q.isSuspended = false }
    for (name, gate) in gates where !ops[name]!.isFinished { gate.signal() }
    let idle = DispatchSemaphore(value: 0)
    let all = Unchecked(value: Array(queues.values))
    DispatchQueue.global().async {
        for q in all.value { q.waitUntilAllOperationsAreFinished() }
        idle.signal()
    }
    #expect(idle.wait(timeout: .now() + 5) == .success, "Foundation's queues did not drain")
    closeStep(expecting: hints.last)

    let ran = Set(log.starts.map(\.name))
    for (name, op) in ops {
        trace.outcomes[name] = Outcome(ran: ran.contains(name), cancelled: op.isCancelled, finished: op.isFinished)
    }
    for name in barrierNames {
        trace.outcomes[name] = Outcome(ran: ran.contains(name), cancelled: false, finished: ran.contains(name))
    }
    trace.order = log.starts.map(\.name)
    trace.maxRunning = log.maxRunning
    withExtendedLifetime((ops, queues)) {}
    return trace
}

/// A step-by-step table of both runs, for failure messages.
func sideBySide(_ steps: [Step], engine: Trace, foundation: Trace) -> String {
    var lines = ["step | engine started | Foundation started"]
    for i in 0..<max(engine.steps.count, foundation.steps.count) {
        let label = i < steps.count ? steps[i].description : "(clean-up)"
        let e = i < engine.steps.count ? engine.steps[i].joined(separator: " ") : "-"
        let f = i < foundation.steps.count ? foundation.steps[i].joined(separator: " ") : "-"
        lines.append("\(e == f ? " " : "≠") \(label) | \(e) | \(f)")
    }
    return lines.joined(separator: "\n")
}

/// Runs a scenario on both sides and expects the same starts per step, the same outcomes
/// and the same peak concurrency.
@discardableResult
func expectSameAsFoundation(_ steps: [Step], sourceLocation: SourceLocation = #_sourceLocation) throws -> (engine: Trace, foundation: Trace) {
    let (engine, hints) = try runEngine(steps)
    let foundation = runFoundation(steps, startsAfterStep: hints)
    #expect(
        engine.steps == foundation.steps, "starts differ:\n\(sideBySide(steps, engine: engine, foundation: foundation))",
        sourceLocation: sourceLocation)
    #expect(engine.outcomes == foundation.outcomes, sourceLocation: sourceLocation)
    #expect(engine.maxRunning == foundation.maxRunning, sourceLocation: sourceLocation)
    return (engine, foundation)
}
