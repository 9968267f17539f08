import Locking

/// Identifies a registered observer.
public struct ObserverToken: Hashable, Sendable {
    let id: UInt64
}

/// The registry of observers and their delivery. Only the engine's single drainer calls
/// `deliver`, so callbacks see changes in `seq` order and never under the engine's lock.
final class ObserverHub: Sendable {
    struct Entry: Sendable {
        let token: ObserverToken
        let keys: Set<ChangeKey>?
        let batch: @Sendable ([ChangeEvent]) -> Void
        /// For an observer of one operation: called if the operation leaves this engine
        /// unfinished (its queue went to another cluster instance, `released`).
        var gone: (@Sendable () -> Void)? = nil
    }
    struct Registry: Sendable {
        var global: [Entry] = []
        var perOperation: [OperationID: [Entry]] = [:]
        var nextID: UInt64 = 1
    }
    private let registry = Lock(Registry())

    func add(
        operation: OperationID?, keys: Set<ChangeKey>?, gone: (@Sendable () -> Void)? = nil, batch: @escaping @Sendable ([ChangeEvent]) -> Void
    ) -> ObserverToken {
        registry.withLock { r in
            let token = ObserverToken(id: r.nextID)
            r.nextID += 1
            let entry = Entry(token: token, keys: keys, batch: batch, gone: gone)
            if let operation { r.perOperation[operation, default: []].append(entry) } else { r.global.append(entry) }
            return token
        }
    }

    func remove(_ token: ObserverToken) {
        registry.withLock { r in
            r.global.removeAll { $0.token == token }
            for (k, v) in r.perOperation where v.contains(where: { $0.token == token }) {
                let rest = v.filter { $0.token != token }
                r.perOperation[k] = rest.isEmpty ? nil : rest
            }
        }
    }

    /// Observers registered for single operations (not yet dropped or removed).
    var perOperationCount: Int { registry.withLock { r in r.perOperation.values.reduce(0) { $0 + $1.count } } }

    /// Removes an observer of one operation without looking through every operation's list.
    func remove(_ token: ObserverToken, of operation: OperationID) {
        registry.withLock { r in
            guard let list = r.perOperation[operation] else { return }
            let rest = list.filter { $0.token != token }
            r.perOperation[operation] = rest.isEmpty ? nil : rest
        }
    }

    /// Operations that left this engine (`QueueEngine.release`): their observers are dropped,
    /// and told (`gone`) when they asked to be.
    func released(_ operations: [OperationID]) {
        let told: [@Sendable () -> Void] = registry.withLock { r in
            guard !r.perOperation.isEmpty else { return [] }
            var told: [@Sendable () -> Void] = []
            for id in operations {
                guard let list = r.perOperation.removeValue(forKey: id) else { continue }
                told.append(contentsOf: list.compactMap(\.gone))
            }
            return told
        }
        for g in told { g() }
    }

    func deliver(_ events: [ChangeEvent]) {
        let (global, hasPer) = registry.withLock { r in (r.global, !r.perOperation.isEmpty) }
        for g in global { g.batch(events) }
        guard hasPer else { return }
        var finished: [OperationID] = []
        for e in events {
            guard let entries = registry.withLock({ $0.perOperation[e.operation] }) else { continue }
            for entry in entries where entry.keys?.contains(e.key) ?? true { entry.batch([e]) }
            if e.key == .isFinished, case .bool(true) = e.new { finished.append(e.operation) }
        }
        if !finished.isEmpty {
            registry.withLock { r in for id in finished { r.perOperation[id] = nil } }
        }
    }
}
