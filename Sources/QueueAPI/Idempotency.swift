import Digest
import Locking
import MicroHTTP
import QueueEngine

/// First answers of creates made with an `Idempotency-Key`, so a retried POST gets the
/// same answer instead of creating a second resource.
///
/// Bounded by count and by bytes (`--max-idempotency-keys`, `--max-idempotency-bytes`): only a
/// SHA-256 of each request body is kept, never the body, and the answer itself (a status
/// document of a few hundred bytes). Keys older than the retention are dropped first; a new
/// key while the cache is still full is refused (429) rather than silently forgetting a key a
/// client may still retry with.
package final class IdempotencyCache: Sendable {
    enum Begin { case new, replay(HTTPResponse), inProgress, mismatch, full(Problem) }
    struct Entry: Sendable {
        var bodyHash: String
        var response: HTTPResponse?
        var createdAt: Timestamp
        var bytes: Int
    }
    struct State: Sendable {
        var entries: [String: Entry] = [:]
        /// Scopes oldest first; `head` is the first live one (entries may already be gone).
        var order: [String] = []
        var head = 0
        var bytes = 0
    }
    private let state = Lock(State())
    let maxKeys: Int
    let maxBytes: Int

    package init(maxKeys: Int, maxBytes: Int) {
        self.maxKeys = max(1, maxKeys)
        self.maxBytes = max(1024, maxBytes)
    }

    /// Identifies "the same request" across restarts: SHA-256 of the body, hex.
    static func hash(_ body: [UInt8]) -> String { SHA256.hex(SHA256.hash(body)) }

    static func size(scope: String, response: HTTPResponse?) -> Int {
        var n = scope.utf8.count + 64 + 96
        if let r = response {
            n += r.body.count
            for (k, v) in r.headers { n += k.utf8.count + v.utf8.count + 32 }
        }
        return n
    }

    /// Answers kept by the store before a restart (oldest first); the newest that fit are kept.
    package func preload(_ records: [(scope: String, bodyHash: String, response: HTTPResponse, createdAt: Timestamp)]) {
        state.withLock { s in
            for r in records where s.entries[r.scope] == nil {
                let bytes = Self.size(scope: r.scope, response: r.response)
                s.entries[r.scope] = Entry(bodyHash: r.bodyHash, response: r.response, createdAt: r.createdAt, bytes: bytes)
                s.order.append(r.scope)
                s.bytes += bytes
            }
            while s.entries.count > maxKeys || s.bytes > maxBytes, s.head < s.order.count { dropOldest(&s) }
            compact(&s)
        }
    }

    var count: Int { state.withLock { $0.entries.count } }
    var bytes: Int { state.withLock { $0.bytes } }

    /// `hash` is `IdempotencyCache.hash(body)` of the request.
    func begin(_ scope: String, hash: String, now: Timestamp, retain: Double) -> Begin {
        state.withLock { s in
            if let e = s.entries[scope] {
                guard e.bodyHash == hash else { return .mismatch }
                guard let r = e.response else { return .inProgress }
                return .replay(r)
            }
            // Expired keys make room first.
            let cutoff = now.adding(seconds: -retain)
            while s.head < s.order.count {
                guard let e = s.entries[s.order[s.head]] else { s.head += 1; continue }
                guard e.createdAt < cutoff else { break }
                dropOldest(&s)
            }
            compact(&s)
            let bytes = Self.size(scope: scope, response: nil) + 1024
            if s.entries.count >= maxKeys || s.bytes + bytes > maxBytes {
                return .full(
                    Problem(
                        429, "too-many-idempotency-keys", "Too Many Requests",
                        "Idempotency-Key: \(s.entries.count) keys (\(s.bytes) bytes) are kept, the limit is \(maxKeys) keys (--max-idempotency-keys) and \(maxBytes) bytes (--max-idempotency-bytes); retry later or without a key",
                        headers: [("Retry-After", "60")]))
            }
            s.entries[scope] = Entry(bodyHash: hash, response: nil, createdAt: now, bytes: bytes)
            s.order.append(scope)
            s.bytes += bytes
            return .new
        }
    }

    func finish(_ scope: String, response: HTTPResponse) {
        state.withLock { s in
            guard var e = s.entries[scope] else { return }
            let bytes = Self.size(scope: scope, response: response)
            s.bytes += bytes - e.bytes
            e.bytes = bytes
            e.response = response
            s.entries[scope] = e
        }
    }

    func abandon(_ scope: String) {
        state.withLock { s in
            if let e = s.entries.removeValue(forKey: scope) { s.bytes -= e.bytes }
        }
    }

    private func dropOldest(_ s: inout State) {
        let scope = s.order[s.head]
        s.head += 1
        if let e = s.entries.removeValue(forKey: scope) { s.bytes -= e.bytes }
    }

    private func compact(_ s: inout State) {
        if s.head > 1024 && s.head * 2 > s.order.count {
            s.order.removeFirst(s.head)
            s.head = 0
        }
    }
}
