import QueueEngine

/// The first answer to a create made with an `Idempotency-Key`, kept so that a retry after a
/// restart still gets it.
public struct IdempotencyRecord: Sendable, Equatable {
    /// The key with whatever it is scoped to (method, path, client).
    public var scope: String
    /// A digest of the request body, to refuse the same key with another body.
    public var bodyHash: String
    /// The HTTP status of the first answer.
    public var status: Int
    /// Its headers, in order.
    public var headers: [(String, String)]
    /// Its body.
    public var body: [UInt8]
    /// When it was saved (for expiry).
    public var createdAt: Timestamp

    /// Creates a record.
    public init(scope: String, bodyHash: String, status: Int, headers: [(String, String)], body: [UInt8], createdAt: Timestamp) {
        self.scope = scope; self.bodyHash = bodyHash; self.status = status
        self.headers = headers; self.body = body; self.createdAt = createdAt
    }

    /// Field by field (tuples are not `Equatable`).
    public static func == (a: IdempotencyRecord, b: IdempotencyRecord) -> Bool {
        a.scope == b.scope && a.bodyHash == b.bodyHash && a.status == b.status && a.body == b.body
            && a.createdAt == b.createdAt && a.headers.count == b.headers.count
            && zip(a.headers, b.headers).allSatisfy { $0.0 == $1.0 && $0.1 == $1.1 }
    }
}

// The first answers to `Idempotency-Key` requests, kept across restarts.
extension SQLiteStore {
    /// Saves the first answer to an `Idempotency-Key` request in the next group commit;
    /// `done` is called once it is durable (send the answer then).
    public func saveIdempotency(
        scope: String, bodyHash: String, status: Int, headers: [(String, String)], body: [UInt8],
        then done: @escaping @Sendable () -> Void
    ) {
        let r = IdempotencyRecord(scope: scope, bodyHash: bodyHash, status: status, headers: headers, body: body, createdAt: SystemClock().now())
        writer.submit(.idempotency(r, done: done))
    }

    /// Saves the first answer to an `Idempotency-Key` request in the next group commit,
    /// without waiting for it.
    public func saveIdempotency(scope: String, bodyHash: String, status: Int, headers: [(String, String)], body: [UInt8]) {
        let r = IdempotencyRecord(scope: scope, bodyHash: bodyHash, status: status, headers: headers, body: body, createdAt: SystemClock().now())
        writer.submit(.idempotency(r, done: nil))
    }

    /// Saves a record as given (its `createdAt` included).
    public func saveIdempotency(_ record: IdempotencyRecord, then done: (@Sendable () -> Void)? = nil) {
        writer.submit(.idempotency(record, done: done))
    }

    /// Every saved answer, oldest first, for the API's cache at start. Unreadable rows are skipped.
    public func loadIdempotency() -> [IdempotencyRecord] {
        (try? reader.withLock { r throws(SQLiteFailure) in try r.idempotency() }) ?? []
    }

    /// Deletes answers saved before `cutoff`, through the writer. Returns how many.
    @discardableResult
    public func purgeIdempotency(before cutoff: Timestamp) -> Int {
        guard !writer.isWriterThread else { return 0 }
        let reply = Reply()
        guard writer.submit(.purgeIdempotency(before: cutoff, reply: reply)) else { return 0 }
        return reply.wait()
    }
}
