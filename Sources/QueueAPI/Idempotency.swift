import MicroHTTP
import Locking

/// First answers of creates made with an `Idempotency-Key`, so a retried POST gets the
/// same answer instead of creating a second resource. Bounded: the oldest keys go first.
final class IdempotencyCache: Sendable {
    enum Begin { case new, replay(HTTPResponse), inProgress, mismatch }
    struct Entry: Sendable {
        var body: [UInt8]
        /// Set instead of `body` for answers loaded from the store.
        var bodyHash: String? = nil
        var response: HTTPResponse?
    }
    private let state = Lock<(entries: [String: Entry], order: [String], head: Int)>(([:], [], 0))
    let capacity: Int

    init(capacity: Int) { self.capacity = capacity }

    /// FNV-1a of a body: identifies "the same request" across restarts.
    static func hash(_ body: [UInt8]) -> String {
        var h: UInt64 = 0xcbf2_9ce4_8422_2325
        for b in body { h = (h ^ UInt64(b)) &* 0x100_0000_01b3 }
        return String(h, radix: 16) + "-" + String(body.count)
    }

    /// Answers kept by the store before a restart.
    func preload(_ records: [(scope: String, bodyHash: String, response: HTTPResponse)]) {
        state.withLock { s in
            for r in records where s.entries[r.scope] == nil {
                s.entries[r.scope] = Entry(body: [], bodyHash: r.bodyHash, response: r.response)
                s.order.append(r.scope)
            }
        }
    }

    func begin(_ scope: String, body: [UInt8]) -> Begin {
        state.withLock { s in
            if let e = s.entries[scope] {
                if let h = e.bodyHash {
                    guard h == Self.hash(body) else { return .mismatch }
                } else {
                    guard e.body == body else { return .mismatch }
                }
                guard let r = e.response else { return .inProgress }
                return .replay(r)
            }
            s.entries[scope] = Entry(body: body, response: nil)
            s.order.append(scope)
            if s.order.count - s.head > capacity {
                s.entries[s.order[s.head]] = nil
                s.head += 1
                if s.head > capacity { s.order.removeFirst(s.head); s.head = 0 }
            }
            return .new
        }
    }

    func finish(_ scope: String, response: HTTPResponse) {
        state.withLock { $0.entries[scope]?.response = response }
    }

    func abandon(_ scope: String) {
        state.withLock { _ = $0.entries.removeValue(forKey: scope) }
    }
}
