import MicroHTTP
import Synchronization

/// First answers of creates made with an `Idempotency-Key`, so a retried POST gets the
/// same answer instead of creating a second resource. Bounded: the oldest keys go first.
final class IdempotencyCache: Sendable {
    enum Begin { case new, replay(HTTPResponse), inProgress, mismatch }
    struct Entry: Sendable {
        var body: [UInt8]
        var response: HTTPResponse?
    }
    private let state = Mutex<(entries: [String: Entry], order: [String], head: Int)>(([:], [], 0))
    let capacity: Int

    init(capacity: Int) { self.capacity = capacity }

    func begin(_ scope: String, body: [UInt8]) -> Begin {
        state.withLock { s in
            if let e = s.entries[scope] {
                guard e.body == body else { return .mismatch }
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
