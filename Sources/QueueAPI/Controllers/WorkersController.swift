import Dispatch
import MicroHTTP
import QueueEngine
import QueueKinds

/// Workers of `external` operations: claim (long poll), heartbeat, progress, finish, and the
/// list of live workers.
package struct WorkersController: Sendable {
    let engine: QueueEngine
    let external: ExternalKind
    let durability: Durability
    let limits: APILimits

    package func addRoutes(to r: inout Router) {
        r.add("POST", "/v1/queues/{name}/claim", scope: .queue(param: 0)) { req, p in try claim(req, p[0]) }
        r.add("POST", "/v1/operations/{id}/heartbeat", scope: .operation(param: 0)) { req, p in try heartbeat(req, p[0]) }
        r.add("POST", "/v1/operations/{id}/progress", scope: .operation(param: 0)) { req, p in try progress(req, p[0]) }
        r.add("POST", "/v1/operations/{id}/finish", scope: .operation(param: 0)) { req, p in try finish(req, p[0]) }
        // Split among instances only when well formed as a whole: a malformed request is
        // refused whole, naming its element, wherever it is answered.
        let limits = self.limits
        let wellFormed: @Sendable (HTTPRequest) -> Bool = { req in (try? Self.parseFinishes(req, limits: limits)) != nil }
        r.add("POST", "/v1/operations:finish", scope: .operationsInBody(list: "finishes", member: "id", valid: wellFormed)) { req, _ in
            try finishMany(req)
        }
        // Leases live in the engine of the queue's holder: in a cluster, every instance's page
        // is gathered and merged (`mergeWorkers`).
        let budget = pageBudget(limits)
        r.add("GET", "/v1/workers", scope: .everyInstance(merge: { pages in Self.mergeWorkers(pages, budget: budget) })) { req, _ in
            try workers(req)
        }
    }

    /// One page of `GET /v1/workers` from the pages of every instance (each answered for the
    /// same `after`): a worker's leases from all of them together, oldest first, its `since`
    /// the oldest. A page cut short (its `next` set) holds every worker of that instance up to
    /// its `next`, so the merged page holds the workers up to the lowest such `next`, and is
    /// cut again at the byte budget; its `next` says where the merge stopped. nil when a page
    /// is not a 200 with the expected shape.
    package static func mergeWorkers(_ pages: [HTTPResponse], budget: Int) -> HTTPResponse? {
        var merged: [String: WorkerEntry] = [:]
        var limit: String?
        for page in pages {
            guard page.status == 200, let top = try? JSONValue.parse(page.body), case let .array(workers)? = top["workers"] else {
                return nil
            }
            if case let .string(next)? = top["next"] { limit = min(limit ?? next, next) }
            for w in workers {
                guard case let .string(name)? = w["worker"], case let .string(since)? = w["since"], case let .array(leases)? = w["leases"] else {
                    return nil
                }
                var entry = merged[name] ?? WorkerEntry(since: since)
                entry.since = min(entry.since, since)
                for l in leases {
                    guard case let .string(op)? = l["operation"], case let .string(queue)? = l["queue"], case let .string(at)? = l["since"],
                        case let .string(expires)? = l["expiresAt"]
                    else { return nil }
                    entry.leases.append(LeaseEntry(operation: op, queue: queue, since: at, expiresAt: expires))
                }
                merged[name] = entry
            }
        }
        return workersPage(merged, budget: budget, through: limit)
    }

    /// One worker of `GET /v1/workers`, its times as written (RFC 3339, fixed width, so they
    /// sort as the times do).
    struct WorkerEntry {
        var since: String
        var leases: [LeaseEntry] = []
    }

    struct LeaseEntry {
        var operation, queue, since, expiresAt: String
    }

    /// The page: workers by name up to `through` (when set), each with its leases oldest first,
    /// cut at the byte budget; `next` is the last worker written when cut, else `through`.
    static func workersPage(_ workers: [String: WorkerEntry], budget: Int, through limit: String?) -> HTTPResponse {
        var o = JSONOut()
        o.open(); o.key("workers"); o.openArray()
        var next: String? = nil, last: String? = nil
        for (worker, entry) in workers.sorted(by: { $0.key < $1.key }) {
            if let limit, worker > limit { break }
            // A page ends at the byte budget; `next` (a worker name) carries on.
            if last != nil && o.bytes.count > budget { next = last; break }
            last = worker
            o.open()
            o.key("worker"); o.string(worker)
            o.key("since"); o.string(entry.since)
            o.key("leases"); o.openArray()
            for l in entry.leases.sorted(by: { ($0.since, $0.operation) < ($1.since, $1.operation) }) {
                o.open()
                o.key("operation"); o.string(l.operation)
                o.key("queue"); o.string(l.queue)
                o.key("since"); o.string(l.since)
                o.key("expiresAt"); o.string(l.expiresAt)
                o.close()
            }
            o.closeArray()
            o.close()
        }
        o.closeArray()
        o.key("next")
        if let n = next ?? limit { o.string(n) } else { o.null() }
        o.close()
        return json(200, o.bytes)
    }

    static func write(_ lease: ExternalKind.Lease, to o: inout JSONOut) {
        o.open()
        o.key("token"); o.string(lease.token)
        o.key("expiresAt"); o.time(lease.expiresAt)
        o.key("worker"); o.string(lease.worker)
        o.close()
    }

    /// `{"operation": status, "lease": {...}}` plus, for heartbeats, the two flags a worker acts on.
    static func answer(_ lease: ExternalKind.Lease, engine: QueueEngine, flags: Bool) -> HTTPResponse {
        var o = JSONOut()
        write(claim: lease, engine: engine, flags: flags, to: &o)
        return json(200, o.bytes)
    }

    static func write(claim lease: ExternalKind.Lease, engine: QueueEngine, flags: Bool, to o: inout JSONOut) {
        write(claim: lease, op: try? engine.operation(lease.operation), flags: flags, to: &o)
    }

    static func write(claim lease: ExternalKind.Lease, op: OperationSnapshot?, flags: Bool, to o: inout JSONOut) {
        o.open()
        o.key("operation")
        if let op { op.write(to: &o) } else { o.null() }
        o.key("lease"); write(lease, to: &o)
        if flags {
            o.key("isCancelled"); o.bool(op?.isCancelled ?? false)
            o.key("isPaused"); o.bool(op?.isPaused ?? false)
        }
        o.close()
    }

    /// A claim's answer: one claim as `{"operation", "lease"}`, or with `max` given,
    /// `{"claims": [{"operation", "lease"}, …]}`.
    /// `claims`: each lease with its operation's status, read when it was handed out.
    /// None: 204, in either form.
    static func answer(claims: [(lease: ExternalKind.Lease, op: OperationSnapshot)], batch: Bool) -> HTTPResponse {
        guard let first = claims.first else { return HTTPResponse(status: 204) }
        guard batch else {
            var o = JSONOut()
            write(claim: first.lease, op: first.op, flags: false, to: &o)
            return json(200, o.bytes)
        }
        var o = JSONOut(capacity: 900 * claims.count + 16)
        o.open(); o.key("claims"); o.openArray()
        for c in claims { write(claim: c.lease, op: c.op, flags: false, to: &o) }
        o.closeArray()
        o.close()
        return json(200, o.bytes)
    }

    /// `POST /v1/queues/{name}/claim?wait=S&max=N`. Leases are saved with their operations, so
    /// the answer waits for that commit; just before it is sent, a client that has gone (it
    /// closed or reset the connection) gets nothing and its leases go back to the front of the
    /// queue at once, with the same attempt, instead of sitting until they expire. A long poll
    /// whose client left is skipped when an operation comes.
    func claim(_ req: HTTPRequest, _ queue: String) throws -> HTTPHandlerResult {
        let q = try Query(req, allowed: ["wait", "max"])
        let wait = try q.seconds("wait", max: 300) ?? 0
        let max = try q.int("max", in: 1...100)
        let b = try Body(req, allowed: ["worker"], emptyIsObject: true)
        let worker = try b.string("worker", maxLength: 128) ?? "worker-\(req.header("x-forwarded-for").map { String($0.prefix(64)) } ?? "anonymous")"
        _ = try engine.queue(named: queue)
        let (external, engine) = (self.external, self.engine)
        let (batch, n) = (max != nil, max ?? 1)
        return .deferred { responder in
            let alive: @Sendable () -> Bool = { !responder.isClientGone }
            // Answers with `leases` once they are durable, or gives them back if the client left.
            let send: @Sendable ([ExternalKind.Lease]) -> Void = { leases in
                // Their statuses as handed out, read before the commit is waited for (what is
                // sent is then durable): read after it, an operation whose queue went to another
                // cluster instance meanwhile would be missing from the answer. One already gone
                // (it moved the moment it was handed out) is given back, not sent without its status.
                var claims: [(lease: ExternalKind.Lease, op: OperationSnapshot)] = []
                var gone: [ExternalKind.Lease] = []
                for (lease, op) in zip(leases, engine.operations(leases.map(\.operation))) {
                    if let op { claims.append((lease, op)) } else { gone.append(lease) }
                }
                if !gone.isEmpty { external.release(gone) }
                let handed = claims
                engine.whenDurable {
                    if responder.isClientGone {
                        external.release(handed.map(\.lease))
                        // Ends the request (a no-op if it already has): a suspended
                        // connection is only let go of by an answer.
                        responder.respond(HTTPResponse(status: 204))
                    } else {
                        responder.respond(Self.answer(claims: handed, batch: batch))
                    }
                }
            }
            let deliver: @Sendable (ExternalKind.Lease) -> Void = { lease in
                guard n > 1 else { send([lease]); return }
                // Woken by the first operation of what is often a burst (a resume, a batch of
                // finishes freeing slots): after one hop, take what else came, up to `max`.
                DispatchQueue.global().async {
                    let (more, _) = external.claim(queue: queue, worker: worker, max: n - 1, isAlive: alive, wait: nil)
                    send([lease] + more)
                }
            }
            let (leases, waiter) = external.claim(
                queue: queue, worker: worker, max: n, isAlive: alive, drop: { responder.respond(HTTPResponse(status: 204)) },
                wait: wait > 0 ? deliver : nil)
            if !leases.isEmpty { send(leases); return }
            guard let waiter else { responder.respond(HTTPResponse(status: 204)); return }
            // The queue left this instance since the check above (a handover, whose release
            // ended the waiters it found): ended now, the worker claims again where it is.
            if (try? engine.queue(named: queue)) == nil, external.cancelClaim(queue: queue, waiter: waiter) {
                responder.respond(HTTPResponse(status: 204))
                return
            }
            // At the timeout, or at shutdown (not 503): 204 (an operation handed out meanwhile is
            // answered by `send`, after its commit).
            LongPoll.ends(responder, after: wait, on: engine.scheduler) {
                if external.cancelClaim(queue: queue, waiter: waiter) { responder.respond(HTTPResponse(status: 204)) }
            }
        }
    }

    func token(_ b: Body) throws(Problem) -> String { try Self.token(b) }

    static func token(_ b: Body) throws(Problem) -> String {
        guard let t = try b.string("leaseToken", maxLength: 128) else { throw Problem.invalid("leaseToken", "is required: the token from the claim") }
        return t
    }

    func heartbeat(_ req: HTTPRequest, _ idText: String) throws -> HTTPHandlerResult {
        _ = try Query(req, allowed: [])
        let id = try parseOperationID(idText)
        let b = try Body(req, allowed: ["leaseToken"])
        let t = try token(b)
        _ = try engine.revision(of: id)
        let lease = try external.heartbeat(id, token: t)
        return durability.ack(Self.answer(lease, engine: engine, flags: true))
    }

    func progress(_ req: HTTPRequest, _ idText: String) throws -> HTTPHandlerResult {
        _ = try Query(req, allowed: [])
        let id = try parseOperationID(idText)
        let b = try Body(req, allowed: ["leaseToken", "completed", "total"])
        let t = try token(b)
        guard let completed = try b.number("completed", in: 0...1e15, what: "a number from 0") else {
            throw Problem.invalid("completed", "is required: a number from 0")
        }
        let total = try b.number("total", in: 0...1e15, what: "a number from 0") ?? 0
        if total > 0 && completed > total { throw Problem.invalid("completed", "must not exceed total (\(total)); got \(completed)") }
        _ = try engine.revision(of: id)
        let lease = try external.lease(id, token: t)
        lease.context.progress(completed: completed, total: total)
        return durability.ack(json(200, try engine.operation(id).json))
    }

    func finish(_ req: HTTPRequest, _ idText: String) throws -> HTTPHandlerResult {
        _ = try Query(req, allowed: [])
        let id = try parseOperationID(idText)
        let b = try Body(req, allowed: ["leaseToken", "result", "error"])
        let t = try token(b)
        let completion = try self.completion(b)
        try finish(id, token: t, completion)
        return durability.ack(json(200, try engine.operation(id).json))
    }

    /// The worker's `result` or `error` as a completion, within `--max-result-bytes`.
    func completion(_ b: Body) throws(Problem) -> Completion { try Self.completion(b, limits: limits) }

    static func completion(_ b: Body, limits: APILimits) throws(Problem) -> Completion {
        let maxResult = limits.resultBytes
        for field in ["result", "error"] {
            if let v = b[field] {
                let size = v.bytes.count
                if size > maxResult {
                    throw Problem(
                        422, "result-too-large", "Result too large",
                        "\(field): \(size) bytes of JSON; the limit (--max-result-bytes) is \(maxResult) bytes")
                }
            }
        }
        switch (b["result"], b["error"]) {
        case (.some, .some): throw Problem.invalid("error", "give either result or error, not both")
        case let (.some(result), nil): return .succeeded(result)
        case let (nil, .some(error)):
            if case let .string(type)? = error["type"] {
                let detail: String
                if case let .string(d)? = error["detail"] { detail = d } else { detail = "" }
                return .failed(type: type, detail: detail, data: error["data"])
            }
            return .failed(type: "worker-error", detail: "the worker reported an error", data: error)
        case (nil, nil): return .succeeded(.null)
        }
    }

    func finish(_ id: OperationID, token t: String, _ completion: Completion) throws {
        let op = try engine.operation(id)
        if op.isFinished { throw Problem(409, "already-finished", "Already finished", "operation \(id) has already finished (\(op.outcome?.rawValue ?? "?"))") }
        try external.finish(id, token: t, completion)
    }

    /// `POST /v1/operations:finish` `{"finishes": [{"id", "leaseToken", "result"|"error"}]}`:
    /// a malformed element refuses the whole request (422 naming it, `finishes[3].leaseToken`,
    /// nothing changed); otherwise each element is finished on its own (one whose operation
    /// is unknown, finished, or not leased with that token does not hold back the others),
    /// and the answer, once every change it made is durable (one group commit for all of
    /// them), is 200 with one entry per element in the request's order: `{"id", "status":
    /// 200, "operation": status}` or `{"id", "status": 404|409, "problem": problem}`.
    func finishMany(_ req: HTTPRequest) throws -> HTTPHandlerResult {
        let parsed = try Self.parseFinishes(req, limits: limits)
        var outcomes: [(id: String?, result: Result<OperationID, Problem>)] = []
        outcomes.reserveCapacity(parsed.count)
        // Checked element by element, then finished together in one engine step.
        var accepted: [(index: Int, id: OperationID, token: String, completion: Completion)] = []
        // What depends on the state (an unknown or finished operation, a lease that is not
        // this worker's) is answered per element; the others are finished all the same.
        for (i, element) in parsed.enumerated() {
            do {
                let id = try parseOperationID(element.text)
                let op = try engine.operation(id)
                if op.isFinished {
                    throw Problem(409, "already-finished", "Already finished", "operation \(id) has already finished (\(op.outcome?.rawValue ?? "?"))")
                }
                accepted.append((i, id, element.token, element.completion))
                outcomes.append((element.text, .success(id)))
            } catch {
                outcomes.append((element.text, .failure(Self.naming(finish: i, Problem.from(error, requestID: req.id)))))
            }
        }
        let refused = external.finish(accepted.map { ($0.id, $0.token, $0.completion) })
        for (k, error) in refused.enumerated() {
            guard let error else { continue }
            let i = accepted[k].index
            outcomes[i].result = .failure(Self.naming(finish: i, error.problem))
        }
        var o = JSONOut(capacity: 700 * parsed.count + 16)
        let finishedIDs: [OperationID] = outcomes.compactMap { if case let .success(id) = $0.result { id } else { nil } }
        var statuses = engine.operations(finishedIDs).makeIterator()
        o.open(); o.key("finishes"); o.openArray()
        for (idText, result) in outcomes {
            o.open()
            o.key("id")
            if let idText { o.string(idText) } else { o.null() }
            switch result {
            case .success:
                o.key("status"); o.int(200)
                o.key("operation")
                if let op = statuses.next() ?? nil { op.write(to: &o) } else { o.null() }
            case let .failure(p):
                o.key("status"); o.int(p.status)
                o.key("problem"); o.raw(p.response.body)
            }
            o.close()
        }
        o.closeArray()
        o.close()
        return durability.ack(json(200, o.bytes))
    }

    /// The elements of a `POST /v1/operations:finish`. A malformed element (unknown field, no id
    /// or leaseToken, a bad result) is a bug of the caller: the whole request is refused,
    /// naming the element, and nothing changes. (A cluster instance checks a request this way
    /// before it splits it among the owners of its operations' queues.)
    static func parseFinishes(_ req: HTTPRequest, limits: APILimits) throws -> [(text: String, token: String, completion: Completion)] {
        _ = try Query(req, allowed: [])
        let b = try Body(req, allowed: ["finishes"])
        guard let list = b["finishes"] else { throw Problem.invalid("finishes", "is required: an array of 1 to \(limits.batch) finishes") }
        guard case let .array(items) = list else { throw Problem.invalid("finishes", "must be an array of finishes; got \(list.typeName)") }
        guard items.count <= limits.batch else {
            throw Problem(
                422, "batch-too-large", "Batch too large", "finishes: at most \(limits.batch) finishes per request (--max-batch); got \(items.count)")
        }
        guard !items.isEmpty else { throw Problem.invalid("finishes", "must hold at least one finish (at most \(limits.batch))") }
        var parsed: [(text: String, token: String, completion: Completion)] = []
        parsed.reserveCapacity(items.count)
        for (i, item) in items.enumerated() {
            do {
                let e = try Body(item, field: "", allowed: ["id", "leaseToken", "result", "error"])
                guard let v = e["id"] else { throw Problem.invalid("id", "is required: the id of the claimed operation") }
                guard case let .string(text) = v else { throw Problem.invalid("id", "must be an operation id string; got \(v.typeName)") }
                guard text.utf8.count <= 128 else { throw Problem.invalid("id", "must be at most 128 bytes") }
                parsed.append((text, try token(e), try completion(e, limits: limits)))
            } catch {
                throw naming(finish: i, Problem.from(error, requestID: req.id))
            }
        }
        return parsed
    }

    /// An element's problem, naming it: `finishes[3].leaseToken: …` for a field, else
    /// `finishes[3]: …`.
    static func naming(finish i: Int, _ problem: Problem) -> Problem {
        var p = problem
        if p.status == 422 || p.status == 400 {
            p.detail = p.detail.hasPrefix(":") ? "finishes[\(i)]\(p.detail)" : "finishes[\(i)].\(p.detail)"
        } else {
            p.detail = "finishes[\(i)]: \(p.detail)"
        }
        return p
    }

    func workers(_ req: HTTPRequest) throws -> HTTPHandlerResult {
        let q = try Query(req, allowed: ["after"])
        let after = q.values["after"]
        var byWorker: [String: WorkerEntry] = [:]
        for l in external.leases where after.map({ l.worker > $0 }) ?? true {
            let lease = LeaseEntry(operation: l.operation.description, queue: l.queue, since: l.since.rfc3339, expiresAt: l.expiresAt.rfc3339)
            var entry = byWorker[l.worker] ?? WorkerEntry(since: lease.since)
            entry.since = min(entry.since, lease.since)
            entry.leases.append(lease)
            byWorker[l.worker] = entry
        }
        return .response(Self.workersPage(byWorker, budget: pageBudget(limits), through: nil))
    }
}
