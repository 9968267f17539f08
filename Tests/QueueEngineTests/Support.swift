import Dispatch
import Foundation
import Locking
import QueueEngine
// The kit (Locked, waitUntil, eventually, temporary directories) for every file of this target.
@_exported import TestKit
import Testing

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

// MARK: - small shared state

/// Milliseconds since an arbitrary fixed point (monotonic).
func monotonicMillis() -> Double { Double(DispatchTime.now().uptimeNanoseconds) / 1e6 }

// MARK: - kinds

/// A kind whose work ends only when the test says so. It records every call the engine makes
/// (start, cancel, pause) with its `ExecutionContext`.
final class ManualKind: OperationKind {
    enum Call: String, Sendable { case start, cancel, pause }
    struct Entry: Sendable {
        var call: Call
        var context: ExecutionContext
        /// Wall-clock time of the call.
        var at: Timestamp = SystemClock().now()
    }
    private let log = Locked<[Entry]>([])

    func start(_ context: ExecutionContext) { log.withLock { $0.append(Entry(call: .start, context: context)) } }
    func cancel(_ context: ExecutionContext) { log.withLock { $0.append(Entry(call: .cancel, context: context)) } }
    func pause(_ context: ExecutionContext) { log.withLock { $0.append(Entry(call: .pause, context: context)) } }

    var entries: [Entry] { log.value }
    /// Operations in the order their work was started (a resume counts as a new start).
    var started: [OperationID] { entries.filter { $0.call == .start }.map(\.context.operation) }
    func calls(_ call: Call, for id: OperationID) -> [ExecutionContext] {
        entries.filter { $0.call == call && $0.context.operation == id }.map(\.context)
    }
    func wasStarted(_ id: OperationID) -> Bool { !calls(.start, for: id).isEmpty }

    /// Reports the end of the latest run of `id`, as the kind's work would.
    func finish(_ id: OperationID, _ completion: Completion = .succeeded(.null)) {
        guard let context = calls(.start, for: id).last else {
            Issue.record("finish(\(id)): the engine never started it")
            return
        }
        context.finish(completion)
    }
}

/// An engine with a `manual` kind and a manual clock that is also its scheduler, the usual
/// setup of these tests: timers fire only when a test advances the clock.
struct Fixture {
    let engine: QueueEngine
    let kind: ManualKind
    let clock: ManualClock

    init(configuration: EngineConfiguration = EngineConfiguration()) {
        kind = ManualKind()
        clock = ManualClock()
        engine = QueueEngine(
            kinds: ["manual": kind, "immediate": ImmediateKind()], store: InMemoryStore(),
            clock: clock, scheduler: clock, configuration: configuration)
    }

    @discardableResult
    func queue(_ name: String, max: Int = -1, suspended: Bool = false) throws -> QueueSnapshot {
        try engine.createQueue(name: name, maxConcurrentOperationCount: max, isSuspended: suspended)
    }

    /// Adds a `manual` operation.
    func add(
        _ queue: String, name: String? = nil, priority: QueuePriority = .normal,
        after dependencies: [OperationID] = [], notBefore: Timestamp? = nil
    ) throws -> OperationID {
        try engine.addOperationID(
            to: queue,
            OperationRequest(
                kind: "manual", name: name, queuePriority: priority, dependencies: dependencies,
                options: OperationOptions(notBefore: notBefore)))
    }

    func state(_ id: OperationID) throws -> OperationState { try engine.operation(id).state }
    func snapshot(_ id: OperationID) throws -> OperationSnapshot { try engine.operation(id) }
}

/// Collects every change a global observer reports.
final class EventLog: Sendable {
    private let events = Locked<[ChangeEvent]>([])
    let token: ObserverToken

    init(_ engine: QueueEngine) {
        let events = self.events
        token = engine.observeAll { batch in events.withLock { $0.append(contentsOf: batch) } }
    }

    var all: [ChangeEvent] { events.value }
    func of(_ id: OperationID) -> [ChangeEvent] { all.filter { $0.operation == id } }
}

/// A compact, readable form of an event for comparisons: `isReady: none->true`.
func describe(_ e: ChangeEvent) -> String {
    func v(_ value: ChangeValue) -> String {
        switch value {
        case .none: return "none"
        case let .bool(b): return String(b)
        case let .priority(p): return p.name
        case let .progress(p): return "\(p.completed)/\(p.total)"
        case let .int(n): return String(n)
        case let .breaker(b): return b.rawValue
        }
    }
    return "\(e.key.rawValue): \(v(e.old))->\(v(e.new))"
}

/// Every suite of this target, run one test at a time. The stress test saturates this
/// machine's cores and libdispatch's shared pool (which Foundation's `OperationQueue` and the
/// Swift Testing runner use too), and the Foundation comparisons and the few time bounds must
/// not run beside it. One at a time, the suite takes about ten seconds.
@Suite(.serialized)
struct Engine {}
