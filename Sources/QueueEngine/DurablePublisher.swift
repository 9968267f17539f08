import Locking

/// Hands change events to "durable" observers only once the store has committed them, in
/// `seq` order.
///
/// The drainer enqueues each batch with the ticket its records were appended under, then asks
/// the store to call `release(upTo:)` once that ticket is durable. The store's callbacks may come
/// on any thread and in any order, but a durable ticket means every earlier one is durable too,
/// so `release` publishes every queued batch up to it, in the order they were enqueued (which is
/// `seq` order): a client shown an event can never see that `seq` name another change after a
/// crash.
final class DurablePublisher: Sendable {
    struct State: Sendable {
        var queued: [(ticket: UInt64, events: [ChangeEvent])] = []
        var head = 0
        var ready: [[ChangeEvent]] = []
        var publishing = false
        var observers: [(id: UInt64, callback: @Sendable ([ChangeEvent]) -> Void)] = []
        var nextID: UInt64 = 1
    }
    private let state = Lock(State())

    func add(_ callback: @escaping @Sendable ([ChangeEvent]) -> Void) -> UInt64 {
        state.withLock { s in
            let id = s.nextID
            s.nextID += 1
            s.observers.append((id, callback))
            return id
        }
    }

    func remove(_ id: UInt64) {
        state.withLock { s in s.observers.removeAll { $0.id == id } }
    }

    var hasObservers: Bool { state.withLock { !$0.observers.isEmpty } }

    /// Called by the engine's single drainer, in ticket order.
    func enqueue(ticket: UInt64, _ events: [ChangeEvent]) {
        state.withLock { s in s.queued.append((ticket, events)) }
    }

    /// Publishes every batch whose ticket is at most `ticket`. One thread publishes at a time;
    /// others only move batches to `ready`, so observers see batches in order, never under a lock.
    func release(upTo ticket: UInt64) {
        var batches: [[ChangeEvent]] = state.withLock { s in
            while s.head < s.queued.count, s.queued[s.head].ticket <= ticket {
                s.ready.append(s.queued[s.head].events)
                s.head += 1
            }
            if s.head > 1024, s.head * 2 > s.queued.count {
                s.queued.removeFirst(s.head)
                s.head = 0
            }
            if s.publishing || s.ready.isEmpty { return [] }
            s.publishing = true
            defer { s.ready = [] }
            return s.ready
        }
        while !batches.isEmpty {
            let observers = state.withLock { $0.observers }
            for batch in batches { for o in observers { o.callback(batch) } }
            batches = state.withLock { s in
                if s.ready.isEmpty { s.publishing = false; return [] }
                defer { s.ready = [] }
                return s.ready
            }
        }
    }
}
