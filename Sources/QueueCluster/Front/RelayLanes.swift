import Dispatch
import Locking
import MicroHTTP
import OutboundHTTP

/// Creates forwarded to one holder that are sent while the client's thread is busy go together
/// (`RelayEnvelope`), like a writer's group commit, but without waiting for anything: each
/// create is put in its holder's lane, and the lane is emptied on the client's thread the next
/// time it wakes (`OutboundHTTPClient.onLoop`), as one envelope when it holds several, as the
/// request itself when it holds one. A create is sent at the same moment as it would be alone;
/// under load the holder gets several per exchange, its writer commits them together, and both
/// instances wake once for them all.
///
/// (An earlier form let at most two exchanges per holder be out and made the rest wait for one
/// to come back. With 16 clients over 3 instances, creates waited often enough to cost more in
/// latency, and in smaller commits at the holder, than the envelopes saved: CLUSTER.md.)
///
/// A holder that does not take envelopes (an instance of an older version during a rolling
/// upgrade, one that refuses the envelope's token) gets each request alone again: nothing in a
/// refused envelope was run.
final class RelayLanes: Sendable {
    /// The most creates in one envelope.
    static let maxBatch = 64
    /// The most creates gathered for one holder; past it a create goes alone.
    static let maxWaiting = 4096
    /// How long a holder that refused an envelope gets requests alone before envelopes are tried again.
    static let unsupportedSeconds = 30.0

    struct Item: Sendable {
        /// The request as it would go alone.
        let single: OutboundRequest
        let inner: RelayEnvelope.Inner
        /// True once the client was answered otherwise (at this instance's shutdown): then it is
        /// not sent at all.
        let isAnswered: @Sendable () -> Bool
        /// Takes the holder's answer (or the failure), as the exchange of `single` would give it.
        let finish: @Sendable (Result<OutboundResponse, OutboundError>) -> Void
    }

    private struct Lane {
        var gathered: [Item] = []
        /// True while an emptying of the lane is due on the client's thread.
        var due = false
        var aloneUntil: DispatchTime = .now()
    }

    private let client: OutboundHTTPClient
    private let requestTimeout: Double
    private let connectTimeout: Double
    private let maxResponseBytes: Int
    private let lanes = Lock<[String: Lane]>([:])
    /// The most bytes of one envelope's body.
    private let maxEnvelopeBytes: Int

    init(client: OutboundHTTPClient, requestTimeout: Double, connectTimeout: Double, maxResponseBytes: Int, maxEnvelopeBytes: Int) {
        self.maxEnvelopeBytes = maxEnvelopeBytes
        self.client = client
        self.requestTimeout = requestTimeout
        self.connectTimeout = connectTimeout
        self.maxResponseBytes = maxResponseBytes
    }

    /// Sends `item` to the holder at `base` when the client's thread next wakes, with whatever
    /// else was gathered for it by then.
    func submit(_ item: Item, to base: String) {
        enum Next { case alone, gathered, due }
        let next: Next = lanes.withLock { lanes in
            var lane = lanes[base] ?? Lane()
            defer { lanes[base] = lane }
            if DispatchTime.now() < lane.aloneUntil || lane.gathered.count >= Self.maxWaiting { return .alone }
            lane.gathered.append(item)
            if lane.due { return .gathered }
            lane.due = true
            return .due
        }
        switch next {
        case .gathered: return
        case .alone: client.send(item.single) { item.finish($0) }
        case .due: client.onLoop { self.empty(base) }
        }
    }

    /// On the client's thread: sends what was gathered for `base`, in envelopes within the bounds.
    private func empty(_ base: String) {
        while true {
            let (batch, alone, more): ([Item], Bool, Bool) = lanes.withLock { lanes in
                guard var lane = lanes[base] else { return ([], false, false) }
                defer { lanes[base] = lane }
                // The holder refused an envelope since these were gathered: all go alone.
                if DispatchTime.now() < lane.aloneUntil {
                    defer { lane.gathered = [] }
                    lane.due = false
                    return (lane.gathered, true, false)
                }
                // At least one; more while the envelope stays within what the holder's
                // `--max-body` takes (the instances of a cluster share their configuration).
                var n = 0, bytes = RelayEnvelope.magic.count + 2
                for item in lane.gathered.prefix(Self.maxBatch) {
                    let size = Self.encodedSize(item.inner)
                    if n > 0 && bytes + size > maxEnvelopeBytes { break }
                    n += 1
                    bytes += size
                }
                let batch = Array(lane.gathered.prefix(n))
                lane.gathered.removeFirst(n)
                if lane.gathered.isEmpty { lane.due = false }
                return (batch, false, !lane.gathered.isEmpty)
            }
            // One answered already (503 at this instance's shutdown) is not sent.
            let live = batch.filter { !$0.isAnswered() }
            if live.count == 1 || alone {
                sendAlone(live)
            } else if !live.isEmpty {
                send(live, to: base)
            }
            if !more { return }
        }
    }

    private func send(_ batch: [Item], to base: String) {
        var url = base
        while url.hasSuffix("/") { url.removeLast() }
        var headers: [(String, String)] = [("Content-Type", RelayEnvelope.contentType), (RelayEnvelope.handBackHeader, "1")]
        // The envelope's route needs the full token when the API has one: every create in it
        // carries it (the forwarder refuses one without before it is relayed).
        if let auth = batch.lazy.compactMap({ $0.inner.headers.first { $0.0.lowercased() == "authorization" } }).first {
            headers.append(auth)
        }
        let envelope = OutboundRequest(
            method: "POST", url: url + RelayEnvelope.path, headers: headers, body: RelayEnvelope.encode(batch.map(\.inner)),
            timeout: requestTimeout, connectTimeout: connectTimeout, maxResponseBytes: maxResponseBytes, followRedirects: false, useProxy: false,
            pathAsIs: true)
        client.send(envelope) { result in self.answered(batch, base: base, result) }
    }

    /// Hands each request of `batch` its answer from the holder's reply.
    private func answered(_ batch: [Item], base: String, _ result: Result<OutboundResponse, OutboundError>) {
        switch result {
        case let .failure(error):
            for item in batch { item.finish(.failure(error)) }
        case let .success(reply) where reply.status == 200 && !reply.truncated:
            guard let answers = RelayEnvelope.decodeResponses(reply.body, expected: batch.count) else {
                // Run there, answered in a form this instance cannot read: each learns so (502).
                let problem = Problem(
                    502, "owner-answer-invalid", "Bad Gateway",
                    "the owner's answer to several relayed requests could not be read; the request may have been handled there"
                ).response
                var bad = reply
                bad.status = problem.status
                bad.headers = problem.headers
                bad.body = problem.body
                for item in batch { item.finish(.success(bad)) }
                return
            }
            var again: [Item] = []
            for (item, answer) in zip(batch, answers) {
                // Held at the holder past what an envelope waits for (its placement behind this
                // one's): it did nothing there, and goes again alone, to be held there as alone.
                if RelayEnvelope.isHandedBack(status: answer.status, headers: answer.headers) {
                    again.append(item)
                    continue
                }
                var one = reply
                one.status = answer.status
                one.headers = answer.headers
                one.body = answer.body
                one.size = answer.body.count
                one.contentLength = answer.body.count
                one.truncated = answer.body.count > item.single.maxResponseBytes
                item.finish(.success(one))
            }
            sendAlone(again.filter { !$0.isAnswered() })
        case let .success(reply) where Self.refusedWhole(reply.status):
            // Nothing in the envelope was run: each goes alone, and the lane sends alone a while.
            refused(base)
            sendAlone(batch.filter { !$0.isAnswered() })
        case let .success(reply):
            // A 503 at the holder's shutdown (each then waits for the next holder, as alone), a
            // 5xx: each gets it, as it would have alone.
            for item in batch { item.finish(.success(reply)) }
        }
    }

    /// Each of `items` in an exchange of its own.
    private func sendAlone(_ items: [Item]) {
        for item in items { client.send(item.single) { item.finish($0) } }
    }

    /// The holder at `base` refused an envelope: requests go to it alone for a while, those
    /// gathered already too.
    func refused(_ base: String) {
        lanes.withLock { lanes in lanes[base, default: Lane()].aloneUntil = .now() + Self.unsupportedSeconds }
    }

    /// How many requests wait in the lane for `base` (tests).
    func gathered(for base: String) -> Int {
        lanes.withLock { $0[base]?.gathered.count ?? 0 }
    }

    /// About the bytes `inner` takes in an envelope (at least; a bound, not an exact count).
    static func encodedSize(_ inner: RelayEnvelope.Inner) -> Int {
        var size = 16 + inner.method.utf8.count + inner.path.utf8.count + inner.body.count
        for (name, value) in inner.query { size += 4 + name.utf8.count + value.utf8.count }
        for (name, value) in inner.headers { size += 6 + name.utf8.count + value.utf8.count }
        return size
    }

    /// Statuses of an envelope refused before anything in it ran: no such route (an older
    /// instance), the token, the form.
    static func refusedWhole(_ status: Int) -> Bool {
        [400, 401, 403, 404, 405, 409, 413, 415, 422].contains(status)
    }
}
