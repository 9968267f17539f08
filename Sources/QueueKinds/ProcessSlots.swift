import Locking
import QueueEngine

/// At most `limit` child processes at once (`--max-commands`): a `command` operation that finds
/// every slot taken stays executing and waits, in arrival order, for one to free; cancelling or
/// pausing it while it waits takes it out of line. No process table can be exhausted by a
/// client creating commands.
final class ProcessSlots: Sendable {
    struct State: Sendable {
        var running = 0
        var waiting: [(operation: OperationID, attempt: Int, launch: @Sendable () -> Bool)] = []
    }
    let limit: Int
    private let state = Lock(State())

    init(limit: Int) { self.limit = max(1, limit) }

    /// Runs `launch` now if a slot is free, else when one is. `launch` returns whether a process
    /// started; if it did, its owner calls `release()` once the process is gone.
    func run(_ operation: OperationID, attempt: Int, _ launch: @escaping @Sendable () -> Bool) {
        let now: Bool = state.withLock { s in
            if s.running < limit { s.running += 1; return true }
            s.waiting.append((operation, attempt, launch))
            return false
        }
        if now && !launch() { release() }
    }

    /// Frees a slot and starts waiting launches, in order, on this thread until one starts a
    /// process (a loop, not recursion: thousands of waiting commands that fail to spawn must not
    /// exhaust the stack).
    func release() {
        while true {
            let next: (@Sendable () -> Bool)? = state.withLock { s in
                if s.waiting.isEmpty { s.running = max(0, s.running - 1); return nil }
                return s.waiting.removeFirst().launch
            }
            guard let next else { return }
            if next() { return }
        }
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
