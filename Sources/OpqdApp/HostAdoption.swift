import Dispatch
import Logging
import PostgresStore
import QueueEngine

/// One host, one state across a cluster (API.md "Hosts"): when the feed shows a breaker change,
/// the host's row is read from the shared store and the engine takes it if it is newer than
/// its own. Its own changes come back too and are left as they are (same revision). Reads run
/// off the feed's thread, one at a time; a burst of changes of one host reads its row once.
final class HostAdoption: Sendable {
    private let pool: PGReadPool
    private let engine: QueueEngine
    private let logger: Logger
    private let queue = DispatchQueue(label: "opqd.host-adoption")

    init(pool: PGReadPool, engine: QueueEngine, logger: Logger) {
        self.pool = pool
        self.engine = engine
        self.logger = logger
    }

    func adopt(_ batch: [ChangeEvent]) {
        var names: [String] = []
        for e in batch where e.key == .breaker && !names.contains(e.queue) { names.append(e.queue) }
        guard !names.isEmpty else { return }
        queue.async { [self, names] in
            for name in names {
                do {
                    if let s = try pool.host(named: name) { engine.adoptHost(s) }
                } catch {
                    logger.warning("the state of host \(name) another instance changed could not be read: \(error)")
                }
            }
        }
    }
}
