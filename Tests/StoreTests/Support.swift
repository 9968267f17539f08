import Dispatch
import Foundation
import Locking
import QueueEngine
import SQLiteStore
// The kit (Locked, waitUntil, eventually, temporary directories) for every file of this target.
@_exported import TestKit
import Testing

extension TemporaryDirectory {
    var database: String { file("opqd.sqlite") }
}

/// Blocks until `ticket` is durable or `timeout` seconds pass; true when it became durable.
@discardableResult
func waitDurable(_ store: any OperationStore, _ ticket: UInt64, timeout: Double = 10) -> Bool {
    let done = DispatchSemaphore(value: 0)
    store.whenDurable(ticket) { done.signal() }
    return done.wait(timeout: .now() + timeout) == .success
}

/// Blocks until everything the engine did so far is durable.
@discardableResult
func waitDurable(_ engine: QueueEngine, timeout: Double = 10) -> Bool {
    let done = DispatchSemaphore(value: 0)
    engine.whenDurable { done.signal() }
    return done.wait(timeout: .now() + timeout) == .success
}

/// A fixed point in time for fixtures.
let t0 = Timestamp(nanoseconds: 1_795_000_000_123_456_789)

func queueSnapshot(
    _ name: String, max: Int = -1, effective: Int = 4, suspended: Bool = false, revision: UInt64 = 1,
    createdAt: Timestamp = t0
) -> QueueSnapshot {
    QueueSnapshot(
        name: name, maxConcurrentOperationCount: max, effectiveMaxConcurrentOperationCount: effective,
        isSuspended: suspended, operationCount: 0, counts: [:], revision: revision, createdAt: createdAt)
}

func operationSnapshot(_ raw: UInt64, queue: String = "q", state: OperationState = .ready) -> OperationSnapshot {
    OperationSnapshot(
        id: OperationID(raw: raw), queue: queue, name: nil, kind: "delay", spec: .object([("seconds", .number(1))]),
        state: state, outcome: nil, isCancelled: false, queuePriority: .normal, dependencies: [], progress: nil,
        attempt: 0, result: nil, error: nil, createdAt: t0, startedAt: nil, finishedAt: nil, revision: 1, options: OperationOptions())
}

func event(
    _ seq: UInt64, _ op: UInt64, queue: String = "q", key: ChangeKey = .isReady, old: ChangeValue = .none,
    new: ChangeValue = .bool(true), state: OperationState = .ready
) -> ChangeEvent {
    ChangeEvent(
        seq: seq, time: t0.adding(seconds: Double(seq)), queue: queue, operation: OperationID(raw: op),
        key: key, old: old, new: new, state: state)
}

/// A kind whose work ends only when the test says so.
final class ManualKind: OperationKind {
    private let log = Locked<[(String, ExecutionContext)]>([])
    func start(_ context: ExecutionContext) { log.withLock { $0.append(("start", context)) } }
    func cancel(_ context: ExecutionContext) { log.withLock { $0.append(("cancel", context)) } }
    func pause(_ context: ExecutionContext) { log.withLock { $0.append(("pause", context)) } }

    func starts(of id: OperationID) -> [ExecutionContext] {
        log.value.filter { $0.0 == "start" && $0.1.operation == id }.map(\.1)
    }

    /// Ends the latest run of `id`.
    func finish(_ id: OperationID, _ completion: Completion = .succeeded(.null)) {
        guard let context = starts(of: id).last else {
            Issue.record("finish(\(id)): never started")
            return
        }
        context.finish(completion)
    }
}

/// A kind whose runs never end by themselves and are resumed after a restart: what was
/// executing is executing again, holding what it held.
final class ResumingKind: OperationKind {
    func start(_ context: ExecutionContext) {}
    func cancel(_ context: ExecutionContext) {}
    func pause(_ context: ExecutionContext) {}
    func recover(_ operation: OperationSnapshot) -> Recovery { .resume }
}

/// A semaphore with a timeout in seconds.
final class DispatchSemaphoreBox: Sendable {
    private let semaphore = DispatchSemaphore(value: 0)
    func signal() { semaphore.signal() }
    func wait(seconds: Double) -> Bool { semaphore.wait(timeout: .now() + seconds) == .success }
}
