import Dispatch
import Grammar
import Locking
import MicroHTTP
import OutboundHTTP
import QueueAPI
import Synchronization

/// Relays one API request to the instance that owns its queue and relays that instance's
/// answer unchanged (status, headers, body), so that a 2xx relayed from the owner still means
/// "durable": the owner answers only after its commit (CLUSTER.md, "Any instance answers any
/// request").
///
/// One ``OutboundHTTPClient`` per forwarder: its libcurl multi handle keeps the connections to
/// each owner alive between requests, so a forwarded request costs one round trip on a warm
/// connection, not a TCP handshake. Its one thread waits for every owner at once, and the
/// answer is `.deferred`, so no server thread blocks while the owner works (or holds a long poll).
///
/// What is not relayed: hop-by-hop fields (RFC 9110 §7.6.1, and those a `Connection` field
/// names), `Host` and `Content-Length` (both belong to the new connection), `Expect` (the
/// request is sent whole). Redirects are never followed and no proxy is used: a 3xx is the
/// owner's answer to the client, and peers talk to each other directly. The path goes out as
/// it came in (no dot segments resolved), so the owner routes what this instance routed; only
/// bytes outside ASCII, which no queue name has, are percent-encoded on the way (by libcurl).
///
/// When the owner does not answer (refused, reset, timeout, an answer cut short) the client
/// gets 503 `owner-unavailable` with `Retry-After: 1`: the request may or may not have taken
/// effect, exactly as with any timeout, and an `Idempotency-Key` makes the retry safe.
package final class Forwarder: Sendable {
    /// Set on every forwarded request, valued with the forwarding instance's id. An instance
    /// that receives a request carrying it handles the request itself, never forwards it again,
    /// so two instances that disagree on the owner for a moment cannot bounce it between them.
    static let header = "opqd-forwarded-by"

    /// True when `request` was forwarded by another instance (see ``header``).
    static func wasForwarded(_ request: HTTPRequest) -> Bool {
        request.header(header) != nil
    }

    /// How many times the request was forwarded already (``hopsHeader``; 1 when only
    /// ``header`` says so, as an instance before this field sends it).
    static let hopsHeader = "opqd-forwarded-hops"

    static func hops(_ request: HTTPRequest) -> Int {
        guard wasForwarded(request) else { return 0 }
        guard let text = request.header(hopsHeader), text.utf8.count <= 2, let n = Int(text), n >= 1 else { return 1 }
        return n
    }

    /// A forwarded request may be forwarded once more: the queue moved on while it was on its
    /// way (a handover), back to its sender too when it moved there. Never a third time, so
    /// instances that disagree on a holder for a moment cannot bounce it between them.
    static let maxHops = 2

    /// Request and response fields that describe one connection, not the message (RFC 9110
    /// §7.6.1), plus `host`, `content-length` and `expect`, which libcurl writes for the new one.
    static let hopByHop: Set<String> = [
        "connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization",
        "te", "trailer", "transfer-encoding", "upgrade", "host", "content-length", "expect",
    ]

    /// Seconds a connection to the owner may take: on a LAN it takes well under a millisecond,
    /// so two seconds without one means the owner is gone, and the client should hear so soon.
    static let connectTimeout = 2.0
    /// Seconds a plain request may take at the owner, answer included, unless the forwarder
    /// was made with another (tests do, to see a timeout without waiting for it).
    static let defaultRequestTimeout = 30.0
    /// Seconds added to a long poll's own wait: the owner answers at the end of the wait, and
    /// its answer still has to be committed and sent.
    static let longPollMargin = 10.0

    let selfID: String
    let maxResponseBytes: Int
    let maxWaitSeconds: Double
    /// Seconds a request that is not a long poll may take, answer included.
    let requestTimeout: Double
    /// The most read of one instance's page when answers are gathered (`gather`): a page is
    /// about `--max-page-bytes`, so a larger one is refused, not parsed.
    let maxGatheredBytes: Int
    let client: OutboundHTTPClient
    /// Creates for one holder that meet on the client's thread go together (`RelayLanes`); nil:
    /// every request goes alone.
    let lanes: RelayLanes?
    /// The largest create body that may go in an envelope.
    let maxRelayedBody: Int

    /// `selfID` goes into ``header``; answers longer than `maxResponseBytes` become 502;
    /// `maxWaitSeconds` is the longest long poll the API accepts (`wait`, `timeout`).
    /// `relayBytes`, when given, sends creates that meet together in envelopes of at most that
    /// many bytes (the holders' `--max-body`).
    package init(
        selfID: String, maxResponseBytes: Int, maxWaitSeconds: Double, requestTimeout: Double = defaultRequestTimeout, maxGatheredBytes: Int = 4 << 20,
        relayBytes: Int? = nil
    ) {
        self.maxGatheredBytes = max(4096, maxGatheredBytes)
        self.selfID = selfID
        self.requestTimeout = requestTimeout.isFinite && requestTimeout > 0 ? min(requestTimeout, 3600) : Self.defaultRequestTimeout
        self.maxResponseBytes = max(0, maxResponseBytes)
        self.maxWaitSeconds = maxWaitSeconds.isFinite ? min(max(maxWaitSeconds, 0), 86_400) : 300
        let client = OutboundHTTPClient()
        self.client = client
        let envelope = relayBytes.map { min(max($0, 1024), 8 << 20) }
        maxRelayedBody = (envelope ?? 0) / 8
        let (timeout, cap) = (self.requestTimeout, min(self.maxResponseBytes, 64 << 20))
        lanes = envelope.map {
            RelayLanes(client: client, requestTimeout: timeout, connectTimeout: Self.connectTimeout, maxResponseBytes: cap, maxEnvelopeBytes: $0)
        }
    }

    /// True for a create (`POST /v1/queues/{name}/operations`, no query) small enough to go in
    /// an envelope: its answer comes at its commit, like its envelope mates'.
    func relayable(_ request: HTTPRequest) -> Bool {
        request.body.count <= maxRelayedBody && Self.isCreate(request)
    }

    /// `POST /v1/queues/{name}/operations` without a query.
    static func isCreate(_ request: HTTPRequest) -> Bool {
        guard request.method == "POST", request.query.isEmpty else { return false }
        let parts = request.path.utf8.split(separator: UInt8(ascii: "/"), omittingEmptySubsequences: false)
        return parts.count == 5 && parts[0].isEmpty && parts[1].elementsEqual("v1".utf8) && parts[2].elementsEqual("queues".utf8) && !parts[3].isEmpty
            && parts[4].elementsEqual("operations".utf8)
    }

    /// The answer of the instance at `base` (e.g. `http://10.0.0.2:8080`, no trailing slash)
    /// to `request`, relayed. Deferred: the server thread returns at once and the connection is
    /// resumed when the owner's answer (or the failure) is in.
    ///
    /// A long poll whose client leaves is let go of at the owner too: every
    /// ``clientCheckInterval`` the forwarder looks whether its client is still there, and when
    /// it is not, aborts the exchange, which closes the connection to the owner. The owner then
    /// sees its own client gone, as it would have seen the real one, so a claim held for a
    /// client that left is not handed out (its leases go back to the queue at once).
    ///
    /// `undelivered`, when given, takes over the responder, with the answer it would have had,
    /// when the owner certainly did not handle the request (``neverHandled``): it refused the
    /// request unstarted while shutting down (a handover under way), or, for a request that may
    /// be sent twice, it no longer listens.
    func forward(
        _ request: HTTPRequest, to base: String, undelivered: (@Sendable (HTTPResponder, HTTPResponse) -> Void)? = nil
    ) -> HTTPHandlerResult {
        // The relayed query keeps one value per name, so the owner could not see a repeat that
        // it would refuse (`Query`); refused here the same way.
        if let name = request.repeatedQueryNames.first {
            return .response(Problem.repeatedQueryParameter(name).response)
        }
        let outbound = outboundRequest(for: request, base: base)
        let isLongPoll = LongPoll.seconds(request) != nil
        let (client, cap) = (self.client, maxResponseBytes)
        let replayable = Self.replayable(request)
        let lanes = isLongPoll || !relayable(request) ? nil : self.lanes
        // At this instance's shutdown, a wait (GET) is asked again with no wait: its status or
        // state now, as at its timeout, well within the shutdown's drain. A claim (POST) is not
        // asked again (it could be handed work nobody takes): 204, as at its timeout.
        let quickAgain: OutboundRequest? =
            isLongPoll && request.method != "POST"
            ? LongPoll.request(request, waiting: 0).map { quick in
                var out = outboundRequest(for: quick, base: base)
                out.timeout = min(out.timeout, Self.quickTimeout)
                return out
            } : nil
        return .deferred { responder in
            // A change may be committed at the owner right now: at shutdown, wait for its
            // answer rather than answer 503. Long polls may hold for minutes, so shutdown
            // answers them at once, as it does local long polls (and the watch below then
            // aborts the exchange, so the owner sees this client gone). Already answered (503
            // at this instance's shutdown, while it was held): nothing is sent.
            if isLongPoll {
                if responder.isAnswered { return }
            } else if !responder.answerBeforeShutdown() {
                return
            }
            // Set once this instance's shutdown asked a long poll for its answer now (below): the
            // exchange it cut short answers nothing, unless the holder answered it for real.
            let hurried = Atomic<Bool>(false)
            let finish: @Sendable (Result<OutboundResponse, OutboundError>) -> Void = { result in
                if hurried.load(ordering: .acquiring), !Self.answered(result) { return }
                let answer = Self.relay(result, maxResponseBytes: cap)
                if let undelivered, Self.neverHandled(result, replayable: replayable) { return undelivered(responder, answer) }
                responder.respond(answer)
            }
            if let lanes {
                let inner = RelayEnvelope.Inner(
                    method: outbound.method, path: request.path, query: request.query, headers: outbound.headers, body: outbound.body ?? [])
                // One the envelope cannot carry exactly (hundreds of fields, a huge one) goes alone.
                if RelayEnvelope.fits(inner) {
                    return lanes.submit(
                        RelayLanes.Item(single: outbound, inner: inner, isAnswered: { responder.isAnswered }, finish: finish), to: base)
                }
            }
            let task = client.send(outbound, completion: finish)
            guard isLongPoll else { return }
            Self.watch(responder, task)
            // At this instance's shutdown, instead of 503: the long exchange is cut (the holder
            // sees this client gone, so a claim is not handed out on it); `cancel` returns once
            // its completion has run, so an answer the holder gave already is relayed. Else the
            // answer its timeout would give (see `quickAgain`). A claim the holder sent just as
            // the exchange was cut is lost to this worker, and offered again when its lease ends.
            responder.answerEarlyAtShutdown {
                hurried.store(true, ordering: .releasing)
                task.cancel()
                guard !responder.isAnswered else { return }
                guard let again = quickAgain else { return responder.respond(HTTPResponse(status: 204)) }
                client.send(again) { result in responder.respond(Self.relay(result, maxResponseBytes: cap)) }
            }
        }
    }

    /// How long a long poll's quick question at shutdown may take (well within the drain).
    static let quickTimeout = 5.0

    /// True when the holder gave a real answer (not a transport failure, not 5xx): a long poll
    /// cut short at shutdown still relays it, should it arrive before the quick one.
    static func answered(_ result: Result<OutboundResponse, OutboundError>) -> Bool {
        if case let .success(response) = result { return response.status < 500 }
        return false
    }

    /// `here` (this instance's answer) and the answers of the instances at `bases` to the same
    /// request (sent at once, as forwarded requests, so each answers for itself), merged by
    /// `merge`. 503 `instance-unavailable` with Retry-After when one of them gives no 200; 502
    /// when their answers cannot be merged.
    func gather(
        _ request: HTTPRequest, from bases: [String], here: HTTPResponse, merge: @escaping @Sendable ([HTTPResponse]) -> HTTPResponse?
    ) -> HTTPHandlerResult {
        let cap = maxGatheredBytes
        let requests = bases.map { base in
            var r = outboundRequest(for: request, base: base)
            r.maxResponseBytes = cap
            return (base: base, request: r)
        }
        let client = self.client
        return .deferred { responder in
            let state = Locking.Lock<(pages: [HTTPResponse], left: Int, failed: String?)>(([here], requests.count, nil))
            for (base, outbound) in requests {
                client.send(outbound) { result in
                    let done: ([HTTPResponse], String?)? = state.withLock { s in
                        switch result {
                        case let .success(a) where a.status == 200 && !a.truncated:
                            s.pages.append(HTTPResponse(status: a.status, headers: a.headers, body: a.body))
                        case let .success(a): s.failed = s.failed ?? "the instance at \(base) answered \(a.status)"
                        case let .failure(e): s.failed = s.failed ?? "the instance at \(base) did not answer (\(e.type))"
                        }
                        s.left -= 1
                        return s.left == 0 ? (s.pages, s.failed) : nil
                    }
                    guard let (pages, failed) = done else { return }
                    if let failed {
                        return responder.respond(
                            Problem(
                                503, "instance-unavailable", "Service Unavailable",
                                "this answer gathers every instance's part, and \(failed); retry shortly", headers: [("Retry-After", "1")]
                            ).response)
                    }
                    responder.respond(
                        merge(pages) ?? Problem(502, "instance-answer-invalid", "Bad Gateway", "the instances' answers could not be merged").response)
                }
            }
        }
    }

    /// True when the owner certainly did not handle the request: a stopping server refused it
    /// before any handler saw it (503 with `Problem.unstartedHeader`; every other 503, e.g. one
    /// at its drain deadline, may come after the request did something); or no connection could
    /// be made, for a request that may be sent twice (`replayable`): libcurl sends a request
    /// again on a new connection when a kept-alive one dies before the answer, so a refused
    /// connection does not prove the first try never arrived.
    static func neverHandled(_ result: Result<OutboundResponse, OutboundError>, replayable: Bool) -> Bool {
        switch result {
        case let .failure(error): return replayable && error.type == "connection-refused"
        case let .success(answer):
            return answer.status == 503 && answer.headers.contains { $0.0.lowercased() == unstartedHeader && $0.1 == "1" }
        }
    }

    static let unstartedHeader = Problem.unstartedHeader.lowercased()

    /// A read, or a change that carries an `Idempotency-Key`: sent twice, it is done once.
    static func replayable(_ request: HTTPRequest) -> Bool {
        request.method == "GET" || request.method == "HEAD" || request.header("idempotency-key") != nil
    }

    /// Seconds between two looks at a long poll's client (a non-blocking peek at its socket).
    static let clientCheckInterval = 0.25

    /// Aborts `task` once `responder`'s client has gone or the request was answered otherwise
    /// (shutdown); ends when the answer is given. Aborting answers the client 503, a no-op for
    /// a connection that is gone, and resumes it, which is what lets MHD release it.
    static func watch(_ responder: HTTPResponder, _ task: OutboundTask) {
        DispatchQueue.global().asyncAfter(deadline: .now() + clientCheckInterval) {
            // True also once answered: then the task has completed and cancel does nothing.
            if responder.isClientGone {
                task.cancel()
            } else {
                watch(responder, task)
            }
        }
    }

    /// The request to send to the owner.
    func outboundRequest(for request: HTTPRequest, base: String) -> OutboundRequest {
        var url = base
        while url.hasSuffix("/") { url.removeLast() }
        url += request.path
        let query = Self.encodeQuery(request.query)
        if !query.isEmpty { url += "?" + query }

        // Fields named by `Connection` are hop-by-hop for this message too.
        let named = Self.connectionTokens([request.header("connection") ?? ""])
        var headers: [(String, String)] = []
        headers.reserveCapacity(request.headers.count + 1)
        // Sorted so the same request is always sent the same way (the dictionary has no order).
        for (name, value) in request.headers.sorted(by: { $0.key < $1.key }) {
            let lower = name.lowercased()
            // The instances' own fields are set here, never relayed from the request.
            guard !Self.hopByHop.contains(lower), !named.contains(lower), lower != Self.header, lower != Self.hopsHeader,
                lower != ClusterFront.splitPartHeader
            else { continue }
            headers.append((name, value))
        }
        headers.append((Self.header, selfID))
        headers.append((Self.hopsHeader, String(Self.hops(request) + 1)))

        // Only methods that carry a body get one; an empty POST still says `Content-Length: 0`.
        let method = request.method
        let carriesBody = !request.body.isEmpty || method == "POST" || method == "PUT" || method == "PATCH"
        return OutboundRequest(
            method: method, url: url, headers: headers, body: carriesBody ? request.body : nil,
            timeout: exchangeTimeout(request), connectTimeout: Self.connectTimeout,
            maxResponseBytes: maxResponseBytes, followRedirects: false, useProxy: false, pathAsIs: true)
    }

    /// Seconds the whole exchange may take: ``requestTimeout``, or for a long poll its wait
    /// (`LongPoll.seconds`: a wait without `timeout` waits 30 s) plus ``longPollMargin`` (the
    /// wait capped at what the API accepts), whichever is longer: a long poll ends with an
    /// answer the owner may have to commit, like any other request.
    func exchangeTimeout(_ request: HTTPRequest) -> Double {
        guard let wait = LongPoll.seconds(request) else { return requestTimeout }
        return max(requestTimeout, min(wait, maxWaitSeconds) + Self.longPollMargin)
    }

    /// The decoded query as a query string: pairs sorted by name, everything outside RFC 3986's
    /// unreserved set percent-encoded (so `&`, `=`, `+`, `%` and space survive the trip).
    static func encodeQuery(_ query: [String: String]) -> String {
        query.sorted { $0.key < $1.key }.map { percentEncoded($0.key) + "=" + percentEncoded($0.value) }.joined(separator: "&")
    }

    /// `text` with every byte outside `A-Z a-z 0-9 - . _ ~` written as `%XX`.
    static func percentEncoded(_ text: String) -> String {
        let hex = Array("0123456789ABCDEF".utf8)
        var out: [UInt8] = []
        out.reserveCapacity(text.utf8.count)
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "0")...UInt8(ascii: "9"),
                UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"), UInt8(ascii: "~"):
                out.append(byte)
            default:
                out.append(contentsOf: [UInt8(ascii: "%"), hex[Int(byte >> 4)], hex[Int(byte & 0xF)]])
            }
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// The field names listed in `Connection` values (`Connection: close, X-Hop` names `x-hop`),
    /// lowercased.
    static func connectionTokens(_ values: [String]) -> Set<String> {
        var names: Set<String> = []
        for value in values {
            for token in value.split(separator: ",") {
                let trimmed = token.drop { $0 == " " || $0 == "\t" }.reversed().drop { $0 == " " || $0 == "\t" }.reversed()
                if !trimmed.isEmpty { names.insert(String(trimmed).lowercased()) }
            }
        }
        return names
    }

    /// The client's answer for the owner's answer or the failure.
    static func relay(_ result: Result<OutboundResponse, OutboundError>, maxResponseBytes: Int) -> HTTPResponse {
        switch result {
        case let .success(answer):
            if answer.truncated {
                return Problem(
                    502, "owner-answer-too-large", "Bad Gateway",
                    "the owner's answer is larger than \(maxResponseBytes) bytes, the most this instance relays; the request was handled there, so do not simply repeat a change without an Idempotency-Key"
                ).response
            }
            let named = connectionTokens(answer.headers.filter { $0.0.lowercased() == "connection" }.map(\.1))
            let headers = answer.headers.filter { name, _ in
                let lower = name.lowercased()
                return !hopByHop.contains(lower) && !named.contains(lower)
            }
            return HTTPResponse(status: answer.status, headers: headers, body: answer.body)
        case let .failure(error) where error.type == "invalid-url":
            // The request could not even be written (e.g. a path libcurl will not send): it
            // never reached the owner, so nothing happened there.
            return Problem.badRequest("the request cannot be forwarded to the queue's owner: \(error.detail)").response
        case let .failure(error):
            return Problem(
                503, "owner-unavailable", "Service Unavailable",
                "the instance that owns this queue did not answer (\(error.type)); the request may or may not have taken effect there. Retry it; send an Idempotency-Key so that a retried create happens once",
                headers: [("Retry-After", "1")]
            ).response
        }
    }
}
