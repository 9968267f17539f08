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
    /// and answered by the queue's next holder, and the reply waits for it, but only for
    /// `relayHoldSeconds` (this instance's placement a moment behind its sender's): past that it
    /// is handed back unstarted (`RelayedHold`), its sender sends it alone, and its envelope
    /// mates' answers, committed, go out.
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
        let (answered, start) = (self.answered, ContinuousClock.now)
        // A sender that sends alone what is handed back (`RelayedHold`) says so; one of an
        // older version gets its creates held or sent on here, as before.
        let handsBack = request.header(RelayEnvelope.handBackHeader) == "1"
        return .deferred { responder in
            // Every answer in it may be a commit made: waited for at shutdown.
            guard responder.answerBeforeShutdown() else { return }
            let gathered = Lock<(answers: [HTTPResponse?], left: Int)>((Array(repeating: nil, count: inner.count), inner.count))
            for (i, one) in inner.enumerated() {
                let take: @Sendable (String?, HTTPResponse) -> Void = { route, answer in
                    // Counted under its own route too, as if it had come alone; not a hand-back,
                    // which its sender sends again (not a failure to alert on).
                    if !RelayEnvelope.isHandedBack(status: answer.status, headers: answer.headers) {
                        answered?(route ?? Router.unmatched, answer.status, ContinuousClock.now - start)
                    }
                    let all: [HTTPResponse]? = gathered.withLock { g in
                        guard g.answers[i] == nil else { return nil }
                        g.answers[i] = answer
                        g.left -= 1
                        return g.left == 0 ? g.answers.compactMap { $0 } : nil
                    }
                    guard let all else { return }
                    responder.respond(HTTPResponse(status: 200, headers: [("Content-Type", RelayEnvelope.contentType)], body: RelayEnvelope.encode(all)))
                }
                Self.deliver(relayed(one, handsBack: handsBack, local: local), to: take)
            }
        }
    }

    /// One relayed request's result here.
    private func relayed(_ request: HTTPRequest, handsBack: Bool, local: @escaping @Sendable (HTTPRequest) -> HTTPHandlerResult) -> HTTPHandlerResult {
        // Only what a forwarder sends (`Forwarder.relayable`): a forwarded create. Nothing else
        // is run from an envelope: no list built 256 times over, no long poll or claim held by
        // a responder of no connection.
        guard Forwarder.wasForwarded(request), Forwarder.isCreate(request) else {
            return .routed(
                Router.unmatched,
                .response(Problem.badRequest("a relayed request must be a forwarded POST /v1/queues/{name}/operations without a query").response))
        }
        // Decided as if it had come alone: answered here, or held here while its queue moves
        // (this instance's placement may be a moment behind the sender's), but for
        // `relayHoldSeconds` at most. One whose queue another instance holds now is handed back
        // at once and goes to it alone: sent on from here, its envelope mates' answers would
        // wait for that exchange, and for that instance's own hold.
        let decision = decide(request)
        let deadline = DispatchTime.now() + holdSeconds
        let claim = handsBack ? RelayedHold() : nil
        switch decision {
        case .forward where handsBack:
            return .routed("forwarded", .response(RelayedHold.handedBack))
        case let .served(queues):
            if case let .ran(result) = runServed(queues, decision, request, until: deadline, claim: claim) { return result ?? local(request) }
            // Its queue left this instance since the decision: held for its next holder.
            let queue = queues.first ?? ""
            return .routed("forwarded", .deferred { responder in hold(request, queue: queue, until: deadline, local: local, responder, claim: claim) })
        case .forward:
            return execute(decision, request, until: deadline, claim: claim) ?? local(request)
        case let .noOwner(queue):
            return .routed("forwarded", .deferred { responder in hold(request, queue: queue, until: deadline, local: local, responder, claim: claim) })
        case let .refused(problem):
            return .routed(Router.unmatched, .response(problem.response))
        default:
            // Not for a create; answered as a request that did nothing here.
            return .routed(Router.unmatched, .response(Self.unstarted))
        }
    }

    /// 503 `no-owner` that says nothing was done (`Opqd-Unstarted`): the sender decides again.
    static var unstarted: HTTPResponse {
        var problem = Problem.noOwner("this instance does not serve the request's queue right now; retry shortly")
        problem.headers.append((Problem.unstartedHeader, "1"))
        return problem.response
    }

    /// Hands `result`'s answer to `take` once it is given, with the route it was answered by
    /// (the innermost named; nil: none).
    static func deliver(_ result: HTTPHandlerResult, route: String? = nil, to take: @escaping @Sendable (String?, HTTPResponse) -> Void) {
        switch result {
        case let .response(r): take(route, r)
        case let .routed(name, inner): deliver(inner, route: name, to: take)
        case let .deferred(body): body(HTTPResponder.detached { take(route, $0) })
        case .stream:
            take(route, Problem.badRequest("a stream cannot be relayed").response)
        }
    }

    /// The token rule of the envelope itself: the full token when the API has one (the
    /// requests in it are checked again, each on its own route).
    private func refusal(forRelay request: HTTPRequest) -> Problem? {
        access.refusal(request, match: router.match(method: request.method, path: request.path))
    }
}

/// The hold of a create that came in a relay envelope (`ClusterFront.hold`): the envelope's
/// reply waits for every create in it, so one held for a moving queue would delay its mates'
/// committed answers by up to the whole hold, and at this instance's shutdown past its drain,
/// turn them all into 503s that may or may not have happened. So its holds end
/// `relayHoldSeconds` after the first began (however often it is held again): the create is
/// answered `handedBack` (it did nothing), and its sender sends it alone, where it is held as
/// long as any request. One that would be sent on to another instance is handed back at once
/// (`handBack`).
///
/// Ending it and running it exclude each other: a hold that has begun to run its request
/// (`leaving`) is not ended, and one that was ended does not run.
final class RelayedHold: Sendable {
    private struct State {
        var held = false
        var ended = false
        /// Counts holds begun, so that a timer set for an earlier one ends no later one.
        var holds = 0
        /// When the holds end, set as the first begins.
        var endAt: DispatchTime?
    }

    private let state = Lock(State())

    /// The hold begins or goes on; false when it was ended (then `responder` has its answer).
    /// A hold that begins ends `seconds` after the first one began, unless it has left by then.
    func holding(_ responder: HTTPResponder, for seconds: Double) -> Bool {
        enum Step { case ended, goesOn, endsNow, begins(Int, DispatchTime) }
        let step: Step = state.withLock { s in
            if s.ended { return .ended }
            if s.held { return .goesOn }
            let now = DispatchTime.now()
            let endAt = s.endAt ?? now + max(0, seconds)
            s.endAt = endAt
            if now >= endAt {
                s.ended = true
                return .endsNow
            }
            s.held = true
            s.holds += 1
            return .begins(s.holds, endAt)
        }
        switch step {
        case .ended: return false
        case .goesOn: return true
        case .endsNow:
            responder.respond(Self.handedBack)
            return false
        case let .begins(hold, endAt):
            DispatchQueue.global().asyncAfter(deadline: endAt) {
                let ends = self.state.withLock { s in
                    guard s.held, !s.ended, s.holds == hold else { return false }
                    s.ended = true
                    return true
                }
                if ends { responder.respond(Self.handedBack) }
            }
            return true
        }
    }

    /// The hold ends to run its request; false when it was ended already (then it is not run).
    func leaving() -> Bool {
        state.withLock { s in
            guard !s.ended else { return false }
            s.held = false
            return true
        }
    }

    /// Ends it now, instead of sending its request on to another instance; false when it was
    /// ended already.
    func handBack(_ responder: HTTPResponder) -> Bool {
        let ends = state.withLock { s in
            guard !s.ended else { return false }
            s.ended = true
            return true
        }
        if ends { responder.respond(Self.handedBack) }
        return ends
    }

    /// 503 `no-owner`, nothing done (`Opqd-Unstarted`), and `Opqd-Relay-Alone`: send it alone.
    static var handedBack: HTTPResponse {
        var problem = Problem.noOwner("this instance does not serve the request's queue; send the request alone")
        problem.headers.append((Problem.unstartedHeader, "1"))
        problem.headers.append((RelayEnvelope.aloneHeader, "1"))
        return problem.response
    }
}
