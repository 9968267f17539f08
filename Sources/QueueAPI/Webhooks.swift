import Dispatch
import Logging
import OutboundHTTP
import QueueEngine
import Locking
import Synchronization

/// Sends one webhook's events in order, one request at a time, without blocking a thread:
/// the next POST starts from the completion of the previous one.
final class Delivery: Sendable {
    struct State: Sendable {
        var pending: [ChangeEvent] = []
        var sending = false
    }
    let client: OutboundHTTPClient
    let target: String
    let logger: Logger
    let id: String
    private let state = Lock(State())

    init(client: OutboundHTTPClient, target: String, logger: Logger, id: String) {
        self.client = client; self.target = target; self.logger = logger; self.id = id
    }

    func enqueue(_ event: ChangeEvent) {
        let start: ChangeEvent? = state.withLock { s in
            if s.sending { s.pending.append(event); return nil }
            s.sending = true
            return event
        }
        if let start { send(start, attempt: 1) }
    }

    private func send(_ event: ChangeEvent, attempt: Int) {
        // The answer is not used beyond its status: keep 4 KiB of it at most.
        let request = OutboundRequest(method: "POST", url: target, headers: [("Content-Type", "application/json")],
                                      body: event.json, timeout: 5, maxResponseBytes: 4096, maxHeaderBytes: 16 * 1024)
        client.send(request) { [self] result in
            let ok = (try? result.get()).map { (200..<300).contains($0.status) } ?? false
            if !ok && attempt == 1 {
                EngineTimers.queue.asyncAfter(deadline: .now() + 1) { self.send(event, attempt: 2) }
                return
            }
            if !ok {
                logger.warning("webhook delivery failed", metadata: ["webhook": "\(id)", "url": "\(target)", "seq": "\(event.seq)"])
            }
            let next: ChangeEvent? = state.withLock { s in
                if s.pending.isEmpty { s.sending = false; return nil }
                return s.pending.removeFirst()
            }
            if let next { send(next, attempt: 1) }
        }
    }
}

/// `POST /v1/operations/{id}/observers`: each matching change is POSTed to a URL as the
/// event JSON, in order, one delivery at a time per webhook, with one retry.
final class Webhooks: Sendable {
    private let logger: Logger
    private let counter = Atomic<UInt64>(0)
    /// One client (one thread) for every webhook: failures are errors, never traps, whatever
    /// the target answers (redirects are followed by its rules: at most 5, http/https only).
    private let client = OutboundHTTPClient()
    /// Registered webhooks by id.
    private let hooks = Lock<[String: Hook]>([:])

    struct Hook: Sendable {
        let id: String
        let operation: OperationID
        let url: String
        let keys: Set<ChangeKey>?
        let token: ObserverToken
    }

    init(logger: Logger) {
        self.logger = logger
    }

    func register(engine: QueueEngine, operation: OperationID, url: String, keys: Set<ChangeKey>?) -> String {
        let n = counter.add(1, ordering: .relaxed).newValue
        let id = "wh-\(n)"
        guard case let .success(target) = OutboundURL.check(url) else { return id }
        let delivery = Delivery(client: client, target: target.url, logger: logger, id: id)
        let token = engine.observe(operation, keys: keys) { event in delivery.enqueue(event) }
        hooks.withLock { $0[id] = Hook(id: id, operation: operation, url: url, keys: keys, token: token) }
        return id
    }

    func hook(_ id: String, of operation: OperationID) -> Hook? {
        hooks.withLock { h in h[id].flatMap { $0.operation == operation ? $0 : nil } }
    }

    func hooks(of operation: OperationID) -> [Hook] {
        hooks.withLock { $0.values.filter { $0.operation == operation } }.sorted { $0.id < $1.id }
    }

    func remove(_ id: String, engine: QueueEngine) {
        if let h = hooks.withLock({ $0.removeValue(forKey: id) }) { engine.removeObserver(h.token) }
    }
}
