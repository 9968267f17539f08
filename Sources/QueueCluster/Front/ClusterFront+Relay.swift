import Dispatch
import Locking
import MicroHTTP
import QueueAPI

extension ClusterFront {
    /// `POST /v1/cluster/relay`: the requests another instance sent together (`RelayEnvelope`),
    /// each run here as if it had come alone, when this instance serves its queue; their answers
    /// in one reply, in order, once every one is in (creates: at their commit).
    ///
    /// Each is decided as it would be alone: a create for a queue moving right now is held here
    /// (bounded) and answered by the queue's next holder, and the reply waits for it.
    func relay(_ request: HTTPRequest) -> HTTPHandlerResult {
        guard let local else {
            return .response(Problem(409, "not-a-cluster", "Conflict", "this instance relays no requests").response)
        }
        if let refused = refusal(forRelay: request) { return .response(refused.response) }
        guard let inner = RelayEnvelope.decodeRequests(request.body, id: request.id) else {
            return .response(
                Problem.badRequest(
                    "the body is not a relay envelope (\(RelayEnvelope.contentType), at most \(RelayEnvelope.maxRequests) requests) that this version reads"
                ).response)
        }
        return .deferred { responder in
            // Every answer in it may be a commit made: waited for at shutdown.
            guard responder.answerBeforeShutdown() else { return }
            let gathered = Lock<(answers: [HTTPResponse?], left: Int)>((Array(repeating: nil, count: inner.count), inner.count))
            for (i, one) in inner.enumerated() {
                let take: @Sendable (HTTPResponse) -> Void = { answer in
                    let all: [HTTPResponse]? = gathered.withLock { g in
                        guard g.answers[i] == nil else { return nil }
                        g.answers[i] = answer
                        g.left -= 1
                        return g.left == 0 ? g.answers.compactMap { $0 } : nil
                    }
                    guard let all else { return }
                    responder.respond(HTTPResponse(status: 200, headers: [("Content-Type", RelayEnvelope.contentType)], body: RelayEnvelope.encode(all)))
                }
                Self.deliver(relayed(one, local: local), to: take)
            }
        }
    }

    /// One relayed request's result here.
    private func relayed(_ request: HTTPRequest, local: @escaping @Sendable (HTTPRequest) -> HTTPHandlerResult) -> HTTPHandlerResult {
        // Only what a forwarder sends (`Forwarder.relayable`): a forwarded create. Nothing else
        // is run from an envelope: no list built 256 times over, no long poll or claim held by
        // a responder of no connection.
        guard Forwarder.wasForwarded(request), Forwarder.isCreate(request) else {
            return .response(Problem.badRequest("a relayed request must be a forwarded POST /v1/queues/{name}/operations without a query").response)
        }
        // Decided as if it had come alone: answered here, held here while its queue moves (this
        // instance's placement may be a moment behind the sender's), or sent on once more.
        let decision = decide(request)
        let deadline = DispatchTime.now() + holdSeconds
        switch decision {
        case .served, .forward:
            return execute(decision, request, until: deadline) ?? local(request)
        case let .noOwner(queue):
            return .deferred { responder in hold(request, queue: queue, until: deadline, local: local, responder) }
        case let .refused(problem):
            return .response(problem.response)
        default:
            // Not for a create; answered as a request that did nothing here.
            return .response(Self.unstarted)
        }
    }

    /// 503 `no-owner` that says nothing was done (`Opqd-Unstarted`): the sender decides again.
    static var unstarted: HTTPResponse {
        var problem = Problem.noOwner("this instance does not serve the request's queue right now; retry shortly")
        problem.headers.append((Problem.unstartedHeader, "1"))
        return problem.response
    }

    /// Hands `result`'s answer to `take` once it is given.
    static func deliver(_ result: HTTPHandlerResult, to take: @escaping @Sendable (HTTPResponse) -> Void) {
        switch result {
        case let .response(r): take(r)
        case let .routed(_, inner): deliver(inner, to: take)
        case let .deferred(body): body(HTTPResponder.detached(onAnswer: take))
        case .stream:
            take(Problem.badRequest("a stream cannot be relayed").response)
        }
    }

    /// The token rule of the envelope itself: the full token when the API has one (the
    /// requests in it are checked again, each on its own route).
    private func refusal(forRelay request: HTTPRequest) -> Problem? {
        access.refusal(request, match: router.match(method: request.method, path: request.path))
    }
}
