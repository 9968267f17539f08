import Dispatch
import Locking
import MicroHTTP
import QueueAPI
import QueueEngine

/// Where a request goes in a partitioned cluster (CLUSTER.md "Any instance answers any
/// request"): answered here when it concerns a queue this instance serves, or nothing
/// queue-scoped (the feed, the cluster, metrics, the page); otherwise forwarded to the
/// instance that holds the queue's partition, its answer relayed unchanged, or 503 with
/// Retry-After while nobody holds it (a takeover under way).
///
/// What a request touches is its route's `scope` in the one route table (`Router`); requests
/// no route matches (404, 405) are answered here.
///
/// A request is forwarded at most twice (`Forwarder.maxHops`): one forwarded here for a queue
/// that moved on meanwhile goes once more to its holder; past that it is held here until this
/// instance serves the queue, or answered 503.
package struct ClusterFront: Sendable {
    let placement: any QueuePlacement
    /// The routes the dispatcher answers by.
    let router: Router
    let engine: QueueEngine
    let forwarder: Forwarder
    let access: Access
    let queues: OperationQueues
    /// Statuses read from PostgreSQL (`FollowerReads`): every queue's, and those of queues and
    /// operations this instance does not hold, which keep answering while their partition moves.
    let reads: APIDispatcher
    /// The dispatcher, for a held request that turns out to be this instance's to answer; nil:
    /// requests for a queue nobody serves are refused at once (503 `no-owner`), not held.
    package var local: (@Sendable (HTTPRequest) -> HTTPHandlerResult)? = nil
    /// Batches over queues of several instances, decided here or asked of this instance as an
    /// owner (`BatchAcross`); nil: refused with 409 `spans-instances`.
    package var batches: BatchAcross? = nil
    /// Counts an answer under its route (`Metrics.answered`): the creates of a relay envelope,
    /// each as if it had come alone (the server counts the envelope).
    package var answered: (@Sendable (String, Int, Duration) -> Void)? = nil
    /// How long a request for a queue nobody serves right now (its partition moving) is held,
    /// looked at again every `holdEvery` seconds, before it is refused with 503 `no-owner`.
    var holdSeconds = 5.0
    var holdEvery = 0.025
    /// How long a create from a relay envelope is held here before it is handed back to its
    /// sender, to be sent alone (`RelayedHold`): its envelope mates' answers wait for it.
    var relayHoldSeconds = 0.25

    /// What becomes of a request (`decide`).
    enum Decision {
        /// Answered here, by the dispatcher.
        case local
        /// Answered here, by the dispatcher: a request for `queues` (one, or a batch's), which
        /// this instance served when it decided. Should a queue's partition leave before the
        /// engine looks (a handover), the engine's 404 for that queue changed nothing and the
        /// request goes where the queue is now (`queueMissing`).
        case served(queues: [String])
        /// Answered here from what the holders committed (`reads`).
        case storeRead
        /// Relayed to the holder of `queue` at this base URL.
        case forward(to: String, queue: String)
        /// Answered by every live instance, their answers merged (`RouteScope.everyInstance`).
        case gather(merge: @Sendable ([HTTPResponse]) -> HTTPResponse?)
        /// Split among the holders of the operations it names (`finishAcross`).
        case split(list: String, member: String, elements: [JSONValue], parts: [FinishPart])
        /// 503 `no-owner`: nobody serves the queue right now, or the request was forwarded
        /// here already (never twice).
        case noOwner(queue: String)
        /// 409 `spans-instances`: one change to queues that several instances hold.
        case spansInstances(what: String, queues: [String])
        /// A batch over queues that several instances hold, decided with them (`BatchAcross`).
        case across
        /// 503: which queue an operation is in could not be read.
        case storeUnavailable(String)
        /// The caller's token does not allow it: refused before anything is read or relayed.
        case refused(Problem)
    }

    /// nil: answer here.
    package func route(_ request: HTTPRequest) -> HTTPHandlerResult? {
        if request.path == RelayEnvelope.path, request.method == "POST", local != nil {
            return .routed("POST /v1/cluster/relay", relay(request))
        }
        // A phase of a batch across instances that this instance holds a part of: its engine
        // work is done inside the gate, like a request served here.
        if let batches, let phase = request.header(BatchAcross.phaseHeader), Forwarder.wasForwarded(request) {
            return placement.whileServing { .routed("batch-part", batches.participate(phase, request)) }
        }
        let deadline = DispatchTime.now() + holdSeconds
        var decision = decide(request)
        // Served here: run inside the gate, once its queues are seen served from inside it (a
        // queue that left meanwhile: decided again, twice at most).
        for _ in 0..<2 {
            guard case let .served(queues) = decision else { break }
            if case let .ran(result) = runServed(queues, decision, request, until: deadline) { return result }
            decision = decide(request)
        }
        if case let .noOwner(queue) = decision, let local {
            // A handover: the queue has no holder this instance can reach yet. The request waits
            // (its connection suspended, no thread held) for the new holder, bounded.
            return .routed("forwarded", .deferred { responder in hold(request, queue: queue, until: deadline, local: local, responder) })
        }
        return execute(decision, request, until: deadline)
    }

    /// What running a request decided "served here" came to.
    enum ServedRun {
        /// `execute`'s result (nil: the dispatcher answers).
        case ran(HTTPHandlerResult?)
        /// One of its queues left this instance since the decision: decide again.
        case moved
    }

    /// Runs `decision` (`.served`) inside the placement's gate (`whileServing`), once every one of
    /// `queues` is seen served from inside it: a partition given up waits for it before its
    /// queues leave the engine, so the handler finds them (a create, a finish, a claim's check),
    /// and a request decided a moment before the partition left is decided again instead.
    /// Only this part of a request is inside the gate: forwarding, reads from PostgreSQL and
    /// holds never make a handover wait.
    func runServed(_ queues: [String], _ decision: Decision, _ request: HTTPRequest, until deadline: DispatchTime, claim: RelayedHold? = nil)
        -> ServedRun
    {
        placement.whileServing {
            guard queues.allSatisfy({ placement.serves(queue: $0) }) else { return .moved }
            return .ran(execute(decision, request, until: deadline, claim: claim))
        }
    }

    /// What `decision` answers; nil: the dispatcher answers. A forwarded request that its holder
    /// certainly did not handle (it is handing its queues over and stopping:
    /// `Forwarder.neverHandled`) is held like one for a moving queue, until `deadline`, and
    /// sent to the next holder.
    /// `claim`: the request came in a relay envelope, and its holds may be ended by it.
    func execute(_ decision: Decision, _ request: HTTPRequest, until deadline: DispatchTime, claim: RelayedHold? = nil) -> HTTPHandlerResult? {
        let problem: Problem
        switch decision {
        case .local: return nil
        case let .served(queues):
            guard let local else { return nil }
            let answer = local(request)
            if let followed = following(answer, request, queues: queues) { return followed }
            guard let missing = Self.response(of: answer), let queue = queues.first(where: { Self.queueMissing(missing, $0) }),
                !placement.serves(queue: queue), DispatchTime.now() < deadline
            else { return answer }
            return .routed("forwarded", .deferred { responder in hold(request, queue: queue, until: deadline, local: local, responder, claim: claim) })
        case .storeRead: return reads.handle(request)
        case let .forward(url, queue):
            var again: (@Sendable (HTTPResponder, HTTPResponse) -> Void)?
            if let local, DispatchTime.now() < deadline {
                let seen = Where(served: placement.serves(queue: queue), holder: placement.holder(ofQueue: queue))
                // A long poll's time at the holder that never handled it counts against its wait.
                let sent = DispatchTime.now()
                again = { responder, failed in
                    // Bounded by the hold: past it, the holder's answer stands.
                    guard DispatchTime.now() < deadline else { return responder.respond(failed) }
                    hold(request, queue: queue, until: deadline, local: local, responder, seen: seen, otherwise: failed, claim: claim, since: sent)
                }
            }
            return .routed("forwarded", forwarder.forward(request, to: url, undelivered: again))
        case let .split(list, member, elements, parts): return finishAcross(request, list: list, member: member, elements: elements, parts: parts)
        case let .gather(merge): return gather(request, merge: merge)
        case .across:
            guard let batches else { return nil }
            return batches.decide(request)
        case let .refused(refusal): problem = refusal
        case let .storeUnavailable(detail): problem = StoreReadUnavailable(detail: detail).problem
        case let .noOwner(queue): problem = Self.noOwner(queue)
        case let .spansInstances(what, names):
            problem = Problem(
                409, "spans-instances", "Queues on several instances",
                "\(what) (\(names.joined(separator: ", "))) are owned by different instances of the cluster; one request can change the queues of one instance only: split it by queue"
            )
        }
        return .routed(Router.unmatched, .response(problem.response))
    }

    /// This instance's answer, and, when it is a 200, every other live instance's to the same
    /// request, merged; nil (the dispatcher answers alone) without a dispatcher to ask or
    /// another instance to ask.
    private func gather(_ request: HTTPRequest, merge: @escaping @Sendable ([HTTPResponse]) -> HTTPResponse?) -> HTTPHandlerResult? {
        guard let local else { return nil }
        let view: ClusterView
        do { view = try placement.clusterView(ownQueues: []) } catch {
            // Not this instance's part alone, as if it were all.
            return .routed(Router.unmatched, .response(Problem.from(error, requestID: request.id).response))
        }
        let others = view.instances.filter { !$0.isSelf && !$0.url.isEmpty }.map(\.url)
        let answer = local(request)
        guard !others.isEmpty, let here = Self.response(of: answer), here.status == 200 else { return answer }
        return .routed("gathered", forwarder.gather(request, from: others, here: here, merge: merge))
    }

    /// A wait served here (`GET …/wait?timeout=S`), run so that it follows its queue: should the
    /// queue go to another instance while it waits, its handler answers `LongPoll.moved`, and the
    /// request is decided again with the rest of its wait (held for the new holder, forwarded
    /// there) instead: the client sees one long poll. Shutdown's early answer is handed on to
    /// the handler. Nil for any other result (answered as it is).
    func following(_ answer: HTTPHandlerResult, _ request: HTTPRequest, queues served: [String]) -> HTTPHandlerResult? {
        guard request.method == "GET" || request.method == "HEAD", let wait = LongPoll.seconds(request), let local else { return nil }
        // A slim copy: a wait may last an hour, and only these parts are needed to decide it
        // again. Decided as if it came from its client: it follows its queue because the queue
        // left (each move is a handover, and the rest of the wait shrinks), so the hops it took
        // to get here do not count against it (one forwarded twice would be held, not sent on).
        let dropping: Set<String> = [Forwarder.header, Forwarder.hopsHeader]
        guard let body = Self.deferredBody(of: answer), let slim = LongPoll.request(request, waiting: wait, dropping: dropping) else { return nil }
        // Where a wait on an operation is: known here, so deciding it again reads no PostgreSQL
        // (its operation left this engine with its queue).
        var operation: OperationID?
        if served.count == 1, case let .found(route, params) = router.match(method: request.method, path: request.path),
            case let .operation(param, _, _) = route.scope, param < params.values.count
        {
            operation = OperationID(params[param])
        }
        let (start, queues, waitedOn) = (DispatchTime.now(), self.queues, operation)
        return Self.replacingDeferred(in: answer) { responder in
            let inner = HTTPResponder.detached { response in
                let spent = Double(DispatchTime.now().uptimeNanoseconds &- start.uptimeNanoseconds) / 1e9
                guard LongPoll.isMoved(response), let again = LongPoll.request(slim, waiting: max(0, wait - spent)) else {
                    return responder.respond(response)
                }
                if let waitedOn, let queue = served.first { queues.remember(waitedOn, in: queue) }
                // Not on the thread that told of the move (a release's, a commit's).
                DispatchQueue.global().async { Self.answer(route(again) ?? local(again), with: responder) }
            }
            responder.answerEarlyAtShutdown { inner.hurry() }
            body(inner)
        }
    }

    /// The `.deferred` body of a result, through its `.routed` labels.
    static func deferredBody(of result: HTTPHandlerResult) -> (@Sendable (HTTPResponder) -> Void)? {
        switch result {
        case let .deferred(body): return body
        case let .routed(_, inner): return deferredBody(of: inner)
        case .response, .stream: return nil
        }
    }

    /// `result` with its `.deferred` body replaced by `body`, its `.routed` labels kept.
    static func replacingDeferred(in result: HTTPHandlerResult, with body: @escaping @Sendable (HTTPResponder) -> Void) -> HTTPHandlerResult {
        switch result {
        case let .routed(label, inner): return .routed(label, replacingDeferred(in: inner, with: body))
        default: return .deferred(body)
        }
    }

    /// The response a handler's result holds, when it holds one at once.
    static func response(of result: HTTPHandlerResult) -> HTTPResponse? {
        switch result {
        case let .response(r): return r
        case let .routed(_, inner): return response(of: inner)
        case .deferred, .stream: return nil
        }
    }

    /// A queue nobody serves: one that does not exist yet in a partition being taken over, or one
    /// moving right now, past the time a request is held for it.
    static func noOwner(_ queue: String) -> Problem {
        Problem.noOwner("no instance serves queue '\(queue)' right now (its partition is moving); retry shortly, with an Idempotency-Key for changes")
    }

    /// Looks again every `holdEvery` seconds until the queue has a holder (then answers as that
    /// decides: here, forwarded, ...) or `deadline` passes (503 `no-owner`, or `otherwise`: what
    /// the holder it was sent to answered, while the placement still names it). The request is
    /// decided again (its body parsed again, for body-scoped routes) only when the placement's
    /// answer for its queue changed, not at every look: a held batch of megabytes costs one
    /// parse per move, not one per 25 ms.
    ///
    /// `claim`: a create from a relay envelope, whose hold the envelope ends (answering it
    /// `RelayedHold.handedBack`) once it has lasted `relayHoldSeconds`; once the hold has ended
    /// so, the request is not run here.
    func hold(
        _ request: HTTPRequest, queue: String, until deadline: DispatchTime, local: @escaping @Sendable (HTTPRequest) -> HTTPHandlerResult,
        _ responder: HTTPResponder, seen: Where? = nil, otherwise: HTTPResponse? = nil, claim: RelayedHold? = nil,
        since: DispatchTime = .now()
    ) {
        // Waited for at this instance's shutdown (the hold ends well within its drain); already
        // answered (503 at shutdown): nothing more is done for it.
        guard responder.answerBeforeShutdown() else { return }
        if let claim, !claim.holding(responder, for: relayHoldSeconds) { return }
        DispatchQueue.global().asyncAfter(deadline: .now() + holdEvery) {
            guard !responder.isAnswered else { return }
            let now = Where(served: placement.serves(queue: queue), holder: placement.holder(ofQueue: queue))
            let moved = now != (seen ?? Where(served: false, holder: nil))
            if moved {
                // A long poll waits what is left of its wait: the time held for the queue's
                // holder is part of it (a client's `timeout=10` held 3 s waits 7 s more there).
                let request = Self.shrinking(request, heldSince: since)
                let decision = decide(request)
                if case .noOwner = decision {
                } else {
                    if let claim {
                        // From an envelope: not sent on from here (its mates would wait for
                        // that exchange); handed back, it goes to its holder alone.
                        if case .forward = decision {
                            _ = claim.handBack(responder)
                            return
                        }
                        // Handed back to its sender a moment ago: it is sent alone, not run here.
                        if !claim.leaving() { return }
                    }
                    if case let .served(queues) = decision {
                        // Left again since: held on (a hold begun again, for a claim).
                        if case let .ran(result) = runServed(queues, decision, request, until: deadline, claim: claim) {
                            return Self.answer(result ?? local(request), with: responder)
                        }
                    } else {
                        return Self.answer(execute(decision, request, until: deadline, claim: claim) ?? local(request), with: responder)
                    }
                }
            }
            let last = moved ? nil : otherwise
            if DispatchTime.now() < deadline {
                return hold(request, queue: queue, until: deadline, local: local, responder, seen: now, otherwise: last, claim: claim, since: since)
            }
            responder.respond(last ?? Self.noOwner(queue).response)
        }
    }

    /// `request` as a long poll held since `since` goes on: with its wait less the time held (at
    /// least 0: answered at once, as at its timeout); any other request as it is.
    static func shrinking(_ request: HTTPRequest, heldSince since: DispatchTime) -> HTTPRequest {
        guard let wait = LongPoll.seconds(request) else { return request }
        let held = Double(DispatchTime.now().uptimeNanoseconds &- since.uptimeNanoseconds) / 1e9
        return LongPoll.request(request, waiting: max(0, wait - held), keepingBody: true) ?? request
    }

    /// True when `answer` is the engine's 404 for `queue` itself (`EngineError.queueNotFound`,
    /// answered at once, never kept for an `Idempotency-Key`): the queue was not there, so the
    /// request changed nothing; in a batch, `operations[i].queue` (all or none: nothing changed
    /// either). A 404 about anything else is the answer: a cancel or a finish reads its
    /// operation again after its change, and sent on, it would be done twice.
    static func queueMissing(_ answer: HTTPResponse, _ queue: String) -> Bool {
        guard answer.status == 404, case let .string(detail)? = (try? JSONValue.parse(answer.body))?["detail"] else { return false }
        let missing = "no queue named '\(queue)'"
        if detail == missing { return true }
        // `OperationsController.naming(element:)`: "operations[12].queue: no queue named 'q'".
        let prefix = "operations[", suffix = "].queue: " + missing
        guard detail.hasPrefix(prefix), detail.hasSuffix(suffix), detail.utf8.count > prefix.utf8.count + suffix.utf8.count else { return false }
        let index = detail.utf8.dropFirst(prefix.utf8.count).dropLast(suffix.utf8.count)
        return index.allSatisfy { $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }
    }

    /// Where the placement puts a held request's queue, as last looked at.
    struct Where: Equatable {
        var served: Bool
        var holder: PlacementHolder?
    }

    /// Hands a result to a responder that already exists (a held request's).
    static func answer(_ result: HTTPHandlerResult, with responder: HTTPResponder) {
        switch result {
        case let .response(r): responder.respond(r)
        case let .deferred(body): body(responder)
        case let .routed(_, inner): answer(inner, with: responder)
        case .stream:
            // No queue-scoped route streams; answered as the held request it was.
            responder.respond(Problem.noOwner("the request cannot be relayed after it was held; retry").response)
        }
    }

    /// Where `request` is answered, from its route's scope and the placement. The token rules
    /// of the route's method are applied before anything is relayed, split or refused for the
    /// cluster's sake, and before PostgreSQL is read for the caller.
    func decide(_ request: HTTPRequest) -> Decision {
        guard case let .found(route, params) = router.match(method: request.method, path: request.path) else { return .local }
        let decision: Decision
        switch route.scope {
        case .instance:
            return .local
        case let .everyInstance(merge):
            // Asked by another instance's gathering: this instance's own part.
            if Forwarder.wasForwarded(request) { return .local }
            return refusal(request).map { .refused($0) } ?? .gather(merge: merge)
        case .everyQueue:
            return .storeRead
        case let .queue(param, reads):
            guard param < params.values.count else { return .local }
            let name = params[param]
            if reads == .fromStore && !placement.serves(queue: name) { return .storeRead }
            decision = to(queue: name, request)
        case let .operation(param, reads, into):
            guard param < params.values.count, let id = OperationID(params[param]) else { return .local }
            let source: String
            if let local = try? engine.operation(id) {
                source = local.queue
            } else {
                // No PostgreSQL read for a caller without the token.
                if let refused = refusal(request) { return .refused(refused) }
                switch queues.queue(of: id) {
                case let .found(queue): source = queue
                case .none: return .local
                case let .unavailable(detail): return .storeUnavailable(detail)
                }
            }
            if reads == .fromStore && !placement.serves(queue: source) { return .storeRead }
            // A copy into a queue another instance owns is made there: the copy's owner reads
            // the source's committed row (`RemoteOperations.operation`).
            if let into, case let .string(target)? = (try? JSONValue.parse(request.body))?[into], target != source,
                placement.holder(ofQueue: target)?.instance != placement.holder(ofQueue: source)?.instance
            {
                decision = to(queue: target, request)
            } else {
                decision = to(queue: source, request)
            }
        case let .queueInBody(member):
            guard case let .string(name)? = (try? JSONValue.parse(request.body))?[member] else { return .local }
            decision = to(queue: name, request)
        case let .queuesInBody(list, member, what):
            guard case let .array(elements)? = (try? JSONValue.parse(request.body))?[list] else { return .local }
            var names = Set<String>()
            for e in elements { if case let .string(q)? = e[member] { names.insert(q) } }
            decision = together(names, request, what: what)
        case let .operationsInBody(list, member, valid):
            if let refused = refusal(request) { return .refused(refused) }
            guard case let .array(elements)? = (try? JSONValue.parse(request.body))?[list] else { return .local }
            // A malformed request (too many elements, a bad one) is refused here, whole, as
            // anywhere, before anything is read or sent: nothing changes (`finishAcross`).
            guard valid(request) else { return .local }
            var queueOf: [Int: String] = [:]
            var missing: [(index: Int, id: OperationID)] = []
            for (i, e) in elements.enumerated() {
                guard case let .string(text)? = e[member], let id = OperationID(text) else { continue }
                if let local = try? engine.operation(id) { queueOf[i] = local.queue } else { missing.append((i, id)) }
            }
            // The others' queues in one read (ids of nothing are answered 404 by whoever answers).
            switch queues.queues(of: missing.map(\.id)) {
            case let .found(found): for m in missing { if let q = found[m.id] { queueOf[m.index] = q } }
            case let .unavailable(detail): return .storeUnavailable(detail)
            }
            decision = split(request, list: list, member: member, elements: elements, queueOf: queueOf)
        }
        switch decision {
        case .local, .served: return decision
        default: break
        }
        // The token rules of the route's method, before a body is relayed for a caller without one.
        return refusal(request).map { .refused($0) } ?? decision
    }

    private func refusal(_ request: HTTPRequest) -> Problem? { access.refusal(request, match: .notFound) }

    /// Operations of several queues, each answered on its own (finishes): here when this
    /// instance serves every queue named, to the holder when one other instance holds them all,
    /// split among the holders otherwise (`finishAcross`).
    private func split(_ request: HTTPRequest, list: String, member: String, elements: [JSONValue], queueOf: [Int: String]) -> Decision {
        let names = Set(queueOf.values)
        let elsewhere = names.filter { !placement.serves(queue: $0) }.sorted()
        // All here: served here (inside the gate); none known: 404s, here.
        guard let first = elsewhere.first else { return names.isEmpty ? .local : .served(queues: names.sorted()) }
        if let moving = elsewhere.first(where: { placement.holder(ofQueue: $0) == nil }) { return to(queue: moving, request) }
        func instance(_ queue: String) -> String {
            placement.serves(queue: queue) ? placement.selfID : placement.holder(ofQueue: queue)?.instance ?? ""
        }
        let instances = Set(names.map(instance))
        // One other instance holds them all: sent there, also when this request was forwarded
        // here already (its sender's view was a moment old: a handover), within the hop bound.
        if instances.count == 1 { return to(queue: first, request) }
        // A share of a request split by another instance is never split again (its elements
        // were shared out by their holders), nor one forwarded twice: 503, the client retries.
        if Forwarder.wasForwarded(request), request.header(Self.splitPartHeader) != nil || Forwarder.hops(request) >= Forwarder.maxHops {
            return placement.serves(queue: first) ? .local : .noOwner(queue: first)
        }
        // Elements of no known operation go with this instance's share (404 there), or the first.
        let fallback = instances.contains(placement.selfID) ? placement.selfID : instance(first)
        var order: [String] = []
        var shares: [String: [Int]] = [:]
        for i in elements.indices {
            let who = queueOf[i].map(instance) ?? fallback
            if shares[who] == nil { order.append(who) }
            shares[who, default: []].append(i)
        }
        var urls: [String: String] = [placement.selfID: placement.selfURL]
        for q in elsewhere { if let h = placement.holder(ofQueue: q) { urls[h.instance] = h.url } }
        var parts: [FinishPart] = []
        for who in order {
            guard let url = urls[who], !url.isEmpty else { return to(queue: first, request) }
            parts.append(FinishPart(url: url, indices: shares[who] ?? []))
        }
        return .split(list: list, member: member, elements: elements, parts: parts)
    }

    /// Requests for several queues at once: here when this instance serves them all, to their
    /// holder when one instance holds them all; otherwise refused (an atomic change across
    /// instances would need a commit across their writers).
    private func together(_ names: Set<String>, _ request: HTTPRequest, what: String) -> Decision {
        let elsewhere = names.filter { !placement.serves(queue: $0) }.sorted()
        guard let first = elsewhere.first else { return names.isEmpty ? .local : .served(queues: names.sorted()) }
        // A queue nobody holds right now (moving): 503, not a refusal of the request's shape.
        if let moving = elsewhere.first(where: { placement.holder(ofQueue: $0) == nil }) { return to(queue: moving, request) }
        if elsewhere.count == names.count && Set(names.map { placement.holder(ofQueue: $0)?.instance ?? "" }).count == 1 {
            return to(queue: first, request)
        }
        if batches != nil { return .across }
        return .spansInstances(what: what, queues: names.sorted())
    }

    /// A request for the queue `name`: here when this instance serves it, else to its holder.
    private func to(queue name: String, _ request: HTTPRequest) -> Decision {
        if placement.serves(queue: name) { return .served(queues: [name]) }
        // Forwarded here already: once more only (the queue moved on while the request was on
        // its way), back to its sender too when that is where it moved (a handover from here
        // to there); a third instance that disagrees holds it until its placement says.
        let hops = Forwarder.hops(request)
        guard hops < Forwarder.maxHops, let holder = placement.holder(ofQueue: name), holder.instance != placement.selfID, !holder.url.isEmpty
        else { return .noOwner(queue: name) }
        return .forward(to: holder.url, queue: name)
    }
}

/// Which queue an operation is in, read from PostgreSQL once and kept (an operation never
/// changes queue); bounded, oldest entries dropped first.
package final class OperationQueues: Sendable {
    enum Answer: Equatable {
        case found(String)
        case none
        case unavailable(String)
    }

    enum Answers: Equatable {
        case found([OperationID: String])
        case unavailable(String)
    }

    private let read: @Sendable (OperationID) throws -> String?
    private let readMany: @Sendable ([OperationID]) throws -> [OperationID: String]
    private let cache = Locking.Lock<(map: [UInt64: String], order: [UInt64], head: Int)>(([:], [], 0))
    static let capacity = 100_000

    package init(read: @escaping @Sendable (OperationID) throws -> String?, readMany: @escaping @Sendable ([OperationID]) throws -> [OperationID: String]) {
        self.read = read
        self.readMany = readMany
    }

    func queue(of id: OperationID) -> Answer {
        if let q = cache.withLock({ $0.map[id.raw] }) { return .found(q) }
        let found: String?
        do { found = try read(id) } catch { return .unavailable("\(error)") }
        guard let found else { return .none }
        keep([id: found])
        return .found(found)
    }

    /// `queue(of:)` of many: those not kept yet in one read. Ids of nothing are left out.
    func queues(of ids: [OperationID]) -> Answers {
        var out: [OperationID: String] = [:]
        let misses: [OperationID] = cache.withLock { c in
            ids.filter { id in
                guard let q = c.map[id.raw] else { return true }
                out[id] = q
                return false
            }
        }
        guard !misses.isEmpty else { return .found(out) }
        let found: [OperationID: String]
        do { found = try readMany(misses) } catch { return .unavailable("\(error)") }
        keep(found)
        out.merge(found) { a, _ in a }
        return .found(out)
    }

    /// Keeps where `id` is, known without a read (a wait that follows its queue).
    func remember(_ id: OperationID, in queue: String) { keep([id: queue]) }

    private func keep(_ found: [OperationID: String]) {
        cache.withLock { c in
            for (id, queue) in found where c.map.updateValue(queue, forKey: id.raw) == nil {
                if c.order.count < Self.capacity {
                    c.order.append(id.raw)
                } else {
                    c.map[c.order[c.head]] = nil
                    c.order[c.head] = id.raw
                    c.head = (c.head + 1) % Self.capacity
                }
            }
        }
    }
}
