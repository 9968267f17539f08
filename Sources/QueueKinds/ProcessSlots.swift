import QueueEngine
import Locking

/// At most `limit` child processes at once (`--max-commands`): a `command` operation that finds
/// every slot taken stays executing and waits, in arrival order, for one to free; cancelling or
/// pausing it while it waits takes it out of line. No process table can be exhausted by a
/// client creating commands.
final class ProcessSlots: Sendable {
    struct State: Sendable {
        var running = 0
        var waiting: [(operation: OperationID, attempt: Int, launch: @Sendable () -> Void)] = []
    }
    let limit: Int
    private let state = Lock(State())

    init(limit: Int) { self.limit = max(1, limit) }

    /// Runs `launch` now if a slot is free, else when one is. `launch` must call `release()`
    /// once its process is gone (or failed to start).
    func run(_ operation: OperationID, attempt: Int, _ launch: @escaping @Sendable () -> Void) {
        let now: Bool = state.withLock { s in
            if s.running < limit { s.running += 1; return true }
            s.waiting.append((operation, attempt, launch))
            return false
        }
        if now { launch() }
    }

    /// Frees a slot and starts the next waiting launch, if any, on this thread.
    func release() {
        let next: (@Sendable () -> Void)? = state.withLock { s in
            if s.waiting.isEmpty { s.running = max(0, s.running - 1); return nil }
            return s.waiting.removeFirst().launch
        }
        next?()
    }

    /// Takes a waiting operation out of line; true if it was waiting.
    func withdraw(_ operation: OperationID, attempt: Int) -> Bool {
        state.withLock { s in
            guard let i = s.waiting.firstIndex(where: { $0.operation == operation && $0.attempt == attempt }) else { return false }
            s.waiting.remove(at: i)
            return true
        }
    }

    var counts: (running: Int, waiting: Int) { state.withLock { ($0.running, $0.waiting.count) } }
}
