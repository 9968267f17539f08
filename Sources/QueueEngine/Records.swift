/// The engine's own mutable records. They live only under the engine's lock.
final class OpRecord: @unchecked Sendable {  // guarded by the engine lock
    let id: UInt64
    let queue: QueueRecord
    let name: String?
    let kindName: String
    let kind: any OperationKind
    let spec: JSONValue?
    let options: OperationOptions
    let createdAt: Timestamp
    let isBarrier: Bool
    var priority: QueuePriority
    var state: OperationState
    var outcome: OperationOutcome?
    var isCancelled = false
    /// Declared dependencies, for display (kept after they finish).
    var dependencyIDs: [OperationID]
    /// Operations waiting for this one; released when it finishes.
    var dependents: [OpRecord] = []
    var unfinishedDependencies = 0
    /// The key of its live entry in the queue's ready heap; 0 when none.
    var heapKey: UInt64 = 0
    var startedAt: Timestamp?
    var finishedAt: Timestamp?
    var attempt = 0
    var result: JSONValue?
    var error: JSONValue?
    var progress: OperationProgress?
    var revision: UInt64 = 1
    var runToken: UInt32 = 0
    /// A completion that arrived while the operation was paused mid-run.
    var parkedCompletion: Completion?
    /// Paused while executing: the next start is a resume.
    var resumeOnStart = false
    var executedNanos: Int64 = 0
    var runStartedAt: Int64 = 0
    /// Waiting for `notBefore`.
    var waitingForTime = false
    var kindState: JSONValue?

    init(id: UInt64, queue: QueueRecord, request: OperationRequest, kind: any OperationKind, createdAt: Timestamp, isBarrier: Bool) {
        self.id = id
        self.queue = queue
        self.name = request.name
        self.kindName = request.kind
        self.kind = kind
        self.spec = request.spec
        self.options = request.options
        self.createdAt = createdAt
        self.isBarrier = isBarrier
        self.priority = request.queuePriority
        self.state = .pending
        self.dependencyIDs = request.dependencies
    }

    var operationID: OperationID { OperationID(raw: id) }
    var hasStarted: Bool { startedAt != nil }

    func snapshot() -> OperationSnapshot {
        OperationSnapshot(
            id: operationID, queue: queue.name, name: name, kind: kindName, spec: spec, state: state, outcome: outcome,
            isCancelled: isCancelled, queuePriority: priority, dependencies: dependencyIDs, progress: progress,
            attempt: attempt, result: result, error: error, createdAt: createdAt, startedAt: startedAt,
            finishedAt: finishedAt, revision: revision, options: options, executedSeconds: Double(executedNanos) / 1e9, kindState: kindState)
    }

    /// Bit set of the boolean keys, in the order they are reported.
    var flags: UInt8 {
        var f: UInt8 = isCancelled ? 1 : 0
        switch state {
        case .paused: f |= 2
        case .ready: f |= 4
        case .executing: f |= 8
        case .finished: f |= 16
        case .pending: break
        }
        return f
    }
}

/// A min-heap entry: lower key starts first (priority rank in the top bits, then id).
struct HeapEntry {
    let key: UInt64
    let op: OpRecord
}

final class QueueRecord: @unchecked Sendable {  // guarded by the engine lock
    let name: String
    let createdAt: Timestamp
    var maxConcurrent: Int
    var isSuspended: Bool
    var executing = 0
    var heap: [HeapEntry] = []
    /// Every operation not yet purged, in creation order.
    var ops: [OpRecord] = []
    var counts: [Int] = [0, 0, 0, 0, 0]
    var unfinished = 0
    var revision: UInt64 = 1
    /// The newest unfinished barrier: operations added after it depend on it.
    var barrier: OpRecord?
    var idleWaiters: [(UInt64, @Sendable (Bool) -> Void)] = []
    var deleted = false

    init(name: String, maxConcurrent: Int, isSuspended: Bool, createdAt: Timestamp) {
        self.name = name; self.maxConcurrent = maxConcurrent; self.isSuspended = isSuspended; self.createdAt = createdAt
    }

    func push(_ op: OpRecord) {
        let key = op.priority.rank << 60 | op.id
        op.heapKey = key
        heap.append(HeapEntry(key: key, op: op))
        var i = heap.count - 1
        while i > 0 {
            let parent = (i - 1) >> 1
            if heap[parent].key <= key { break }
            heap.swapAt(parent, i)
            i = parent
        }
    }

    /// Pops the next live ready entry, skipping stale ones (paused, cancelled, re-prioritised).
    func popReady() -> OpRecord? {
        while let top = heap.first {
            removeTop()
            if top.op.heapKey == top.key && top.op.state == .ready {
                top.op.heapKey = 0
                return top.op
            }
        }
        return nil
    }

    private func removeTop() {
        let last = heap.removeLast()
        if heap.isEmpty { return }
        heap[0] = last
        var i = 0
        let n = heap.count
        while true {
            let l = 2 * i + 1
            if l >= n { break }
            var c = l
            if l + 1 < n && heap[l + 1].key < heap[l].key { c = l + 1 }
            if heap[c].key >= heap[i].key { break }
            heap.swapAt(c, i)
            i = c
        }
    }

    func snapshot(defaultMax: Int) -> QueueSnapshot {
        var byState: [OperationState: Int] = [:]
        for s in OperationState.allCases { byState[s] = counts[s.index] }
        return QueueSnapshot(
            name: name, maxConcurrentOperationCount: maxConcurrent,
            effectiveMaxConcurrentOperationCount: maxConcurrent < 0 ? defaultMax : maxConcurrent,
            isSuspended: isSuspended, operationCount: unfinished, counts: byState, revision: revision, createdAt: createdAt)
    }
}

extension OperationState {
    var index: Int {
        switch self {
        case .pending: return 0
        case .ready: return 1
        case .executing: return 2
        case .paused: return 3
        case .finished: return 4
        }
    }
}
