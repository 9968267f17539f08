import Dispatch
import Locking
import MicroHTTP
import OutboundHTTP

/// Creates forwarded to one holder go at most `exchanges` exchanges at a time; those that arrive
/// while they are out wait and go together in the next (`RelayEnvelope`), like a writer's group
/// commit. Under light
/// load nothing waits (a create goes alone, as before); under load the holder gets several creates
/// per exchange, its writer commits them together, and both instances wake once for them all.
///
/// A holder that does not take envelopes (an instance of an older version during a rolling
/// upgrade, one that refuses the envelope's token) gets each request alone again: nothing in a
/// refused envelope was run.
final class RelayLanes: Sendable {
    /// The most creates in one envelope.
    static let maxBatch = 64
    /// The most creates waiting for one holder; past it a create goes alone.
    static let maxWaiting = 4096
    /// How long a holder that refused an envelope gets requests alone before envelopes are tried again.
    static let unsupportedSeconds = 30.0

    /// The longest a create waits for an exchange. Exchanges take milliseconds; a holder that
    /// keeps both out longer is stuck, and a create that waited this long is answered that it was
    /// not sent (503 `Opqd-Unstarted`: its sender holds it for the next holder, or its client
    /// retries): never sent later, when its client may have given up and created it again.
    static let maxWaitSeconds = 1.0

    struct Item: Sendable {
        /// The request as it would go alone.
        let single: OutboundRequest
        let inner: RelayEnvelope.Inner
        let queuedAt: DispatchTime
        /// True once the client was answered otherwise (at this instance's shutdown): then it is
        /// not sent at all.
        let isAnswered: @Sendable () -> Bool
        /// Takes the holder's answer (or the failure), as the exchange of `single` would give it.
        let finish: @Sendable (Result<OutboundResponse, OutboundError>) -> Void
    }

    /// Exchanges out to one holder at once. One makes the largest envelopes, but a create then
    /// often waits a whole exchange behind another: with 16 clients over 3 instances that cost
    /// more in lost batching at the holder than the envelopes saved (CLUSTER.md).
    static let exchanges = 2

    private struct Lane {
        var out = 0
        var waiting: [Item] = []
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

    /// Sends `item` to the holder at `base`: now when nothing is out to it, else with the next
    /// exchange.
    func submit(_ item: Item, to base: String) {
        enum Next { case lead, alone, wait, firstToWait }
        let next: Next = lanes.withLock { lanes in
            var lane = lanes[base] ?? Lane()
            defer { lanes[base] = lane }
            if DispatchTime.now() < lane.aloneUntil || lane.waiting.count >= Self.maxWaiting { return .alone }
            if lane.out >= Self.exchanges {
                lane.waiting.append(item)
                return lane.waiting.count == 1 ? .firstToWait : .wait
            }
            lane.out += 1
            return .lead
        }
        switch next {
        case .wait: return
        case .firstToWait: sweepLater(base)
        case .alone: _ = client.send(item.single) { item.finish($0) }
        case .lead: send([item], to: base)
        }
    }

    /// While creates wait for `base`, looks every `maxWaitSeconds` for those that waited too long
    /// (both exchanges stuck at the holder) and answers them unsent.
    private func sweepLater(_ base: String) {
        DispatchQueue.global().asyncAfter(deadline: .now() + Self.maxWaitSeconds) {
            let (stale, more): ([Item], Bool) = self.lanes.withLock { lanes in
                guard var lane = lanes[base] else { return ([], false) }
                defer { lanes[base] = lane }
                let (stale, kept) = Self.split(lane.waiting, now: .now())
                lane.waiting = kept
                return (stale, !kept.isEmpty)
            }
            Self.unsent(stale)
            if more { self.sweepLater(base) }
        }
    }

    /// `waiting` split into what waited past `maxWaitSeconds` or was answered meanwhile, and the rest.
    private static func split(_ waiting: [Item], now: DispatchTime) -> (stale: [Item], kept: [Item]) {
        let limit = UInt64(maxWaitSeconds * 1e9)
        var stale: [Item] = [], kept: [Item] = []
        for item in waiting {
            if item.isAnswered() || now.uptimeNanoseconds &- item.queuedAt.uptimeNanoseconds > limit { stale.append(item) } else { kept.append(item) }
        }
        return (stale, kept)
    }

    /// Answers creates that were never sent: 503 with `Opqd-Unstarted` (a no-op for one answered already).
    private static func unsent(_ items: [Item]) {
        guard !items.isEmpty else { return }
        let body = Array(
            #"{"type":"https://opqd.dev/problems/owner-unavailable","title":"Service Unavailable","status":503,"detail":"the instance that owns this queue kept this instance's earlier requests waiting; this one was not sent. Retry it; send an Idempotency-Key so that a retried create happens once"}"#
                .utf8)
        let answer = OutboundResponse(
            status: 503, headers: [("Content-Type", "application/problem+json"), ("Retry-After", "1"), (Problem.unstartedHeader, "1")], body: body,
            truncated: false, size: body.count, contentLength: body.count, finalURL: "", redirects: 0)
        for item in items { item.finish(.success(answer)) }
    }

    /// What waits for `base`, sent as the next exchange; one exchange fewer is out when nothing waits.
    private func next(_ base: String) {
        let (batch, stale, alone): ([Item], [Item], Bool) = lanes.withLock { lanes in
            guard var lane = lanes[base] else { return ([], [], false) }
            defer { lanes[base] = lane }
            let now = DispatchTime.now()
            let (stale, kept) = Self.split(lane.waiting, now: now)
            lane.waiting = kept
            guard !lane.waiting.isEmpty else {
                lane.out -= 1
                return ([], stale, false)
            }
            // At least one; more while the envelope stays within what the holder's `--max-body`
            // takes (the instances of a cluster share their configuration).
            var n = 0, bytes = RelayEnvelope.magic.count + 2
            for item in lane.waiting.prefix(Self.maxBatch) {
                let size = Self.encodedSize(item.inner)
                if n > 0 && bytes + size > maxEnvelopeBytes { break }
                n += 1
                bytes += size
            }
            let batch = Array(lane.waiting.prefix(n))
            lane.waiting.removeFirst(n)
            return (batch, stale, now < lane.aloneUntil)
        }
        Self.unsent(stale)
        guard !batch.isEmpty else { return }
        // The holder refused an envelope a moment ago: these go alone, and the next waits as usual.
        if alone && batch.count > 1 {
            for item in batch.dropLast() { _ = client.send(item.single) { item.finish($0) } }
            return send([batch[batch.count - 1]], to: base)
        }
        send(batch, to: base)
    }

    private func send(_ batch: [Item], to base: String) {
        guard batch.count > 1 else {
            let item = batch[0]
            _ = client.send(item.single) { result in
                item.finish(result)
                self.next(base)
            }
            return
        }
        var url = base
        while url.hasSuffix("/") { url.removeLast() }
        var headers: [(String, String)] = [("Content-Type", RelayEnvelope.contentType)]
        // The envelope's route needs the full token when the API has one: every create in it
        // carries it (the forwarder refuses one without before it is relayed).
        if let auth = batch.lazy.compactMap({ $0.inner.headers.first { $0.0.lowercased() == "authorization" } }).first {
            headers.append(auth)
        }
        let envelope = OutboundRequest(
            method: "POST", url: url + RelayEnvelope.path, headers: headers, body: RelayEnvelope.encode(batch.map(\.inner)),
            timeout: requestTimeout, connectTimeout: connectTimeout, maxResponseBytes: maxResponseBytes, followRedirects: false, useProxy: false,
            pathAsIs: true)
        _ = client.send(envelope) { result in
            self.answered(batch, base: base, result)
            self.next(base)
        }
    }

    /// Hands each request of `batch` its answer from the holder's reply.
    private func answered(_ batch: [Item], base: String, _ result: Result<OutboundResponse, OutboundError>) {
        switch result {
        case let .failure(error):
            for item in batch { item.finish(.failure(error)) }
        case let .success(reply) where reply.status == 200 && !reply.truncated:
            guard let answers = RelayEnvelope.decodeResponses(reply.body, expected: batch.count) else {
                // Run there, answered in a form this instance cannot read: each learns so (502).
                var bad = reply
                bad.status = 502
                bad.headers = [("Content-Type", "application/problem+json")]
                bad.body = Array(
                    #"{"type":"https://opqd.dev/problems/owner-answer-invalid","title":"Bad Gateway","status":502,"detail":"the owner's answer to several relayed requests could not be read; the request may have been handled there"}"#
                        .utf8)
                for item in batch { item.finish(.success(bad)) }
                return
            }
            for (item, answer) in zip(batch, answers) {
                var one = reply
                one.status = answer.status
                one.headers = answer.headers
                one.body = answer.body
                one.size = answer.body.count
                one.contentLength = answer.body.count
                one.truncated = answer.body.count > item.single.maxResponseBytes
                item.finish(.success(one))
            }
        case let .success(reply) where Self.refusedWhole(reply.status):
            // Nothing in the envelope was run: each goes alone, and the lane sends alone a while.
            lanes.withLock { lanes in lanes[base]?.aloneUntil = .now() + Self.unsupportedSeconds }
            for item in batch { _ = client.send(item.single) { item.finish($0) } }
        case let .success(reply):
            // A 503 at the holder's shutdown (each then waits for the next holder, as alone), a
            // 5xx: each gets it, as it would have alone.
            for item in batch { item.finish(.success(reply)) }
        }
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
