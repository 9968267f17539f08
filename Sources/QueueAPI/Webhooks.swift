import Dispatch
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Logging
import QueueEngine
import Locking
import Synchronization

/// `POST /v1/operations/{id}/observers`: each matching change is POSTed to a URL as the
/// event JSON, in order, one delivery at a time per webhook, with one retry.
final class Webhooks: Sendable {
    private let logger: Logger
    private let counter = Atomic<UInt64>(0)
    private let session: URLSession
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
        let config = URLSessionConfiguration.ephemeral
        config.timeoutIntervalForRequest = 5
        self.session = URLSession(configuration: config)
    }

    func register(engine: QueueEngine, operation: OperationID, url: String, keys: Set<ChangeKey>?) -> String {
        let n = counter.add(1, ordering: .relaxed).newValue
        let id = "wh-\(n)"
        let queue = DispatchQueue(label: "opqd.webhook.\(n)")
        let (session, logger) = (self.session, self.logger)
        guard let target = URL(string: url) else { return id }
        let token = engine.observe(operation, keys: keys) { event in
            let body = Data(event.json)
            queue.async {
                for attempt in 1...2 {
                    var request = URLRequest(url: target)
                    request.httpMethod = "POST"
                    request.setValue("application/json", forHTTPHeaderField: "Content-Type")
                    request.httpBody = body
                    let done = DispatchSemaphore(value: 0)
                    let ok = Atomic<Bool>(false)
                    session.dataTask(with: request) { _, response, _ in
                        if let h = response as? HTTPURLResponse, (200..<300).contains(h.statusCode) { ok.store(true, ordering: .relaxed) }
                        done.signal()
                    }.resume()
                    done.wait()
                    if ok.load(ordering: .relaxed) { return }
                    if attempt == 1 { Thread.sleep(forTimeInterval: 1) }
                }
                logger.warning("webhook delivery failed", metadata: ["webhook": "\(id)", "url": "\(url)", "seq": "\(event.seq)"])
            }
        }
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
