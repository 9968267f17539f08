import Digest
import Dispatch
import Locking
import MicroHTTP
import OutboundHTTP
import PostgresStore
import QueueAPI
import QueueEngine

#if canImport(Glibc)
import Glibc
#endif

/// The deciding instance's side of a batch across instances (see `BatchAcross`).
extension BatchAcross {
    /// Decides `request`, a batch whose queues several instances hold. Checked here first, as
    /// every owner checks it: a malformed batch is refused before anything is sent.
    func decide(_ request: HTTPRequest) -> HTTPHandlerResult {
        let elements: [BatchElement]
        do { elements = try parser.batchElements(request) } catch { return .response(Problem.from(error, requestID: request.id).response) }
        // An admission is decided under the lock of the engine that holds its queue, against the
        // operations it holds; parts set aside ahead of time (an id each) cannot say "merged".
        if let i = elements.firstIndex(where: { $0.request.admission != nil }) {
            return .response(
                Problem(
                    409, "spans-instances", "Batch spans instances",
                    "operations[\(i)].admission: a batch whose queues several instances hold cannot carry an admission; send the elements with an admission in a batch (or creates) of their own queue's instance"
                ).response)
        }
        var key: (scope: String, bodyHash: [UInt8])?
        if let k = request.header("idempotency-key") {
            guard !k.isEmpty, k.utf8.count <= 255 else {
                return .response(Problem(422, "invalid-field", "Invalid field", "Idempotency-Key: must be 1 to 255 characters").response)
            }
            key = (SHA256.hex(SHA256.hash(Array((request.path + "\u{0}" + k).utf8))), SHA256.hash(request.body))
        }
        let found = key
        return .routed(
            "batch-across",
            .deferred { responder in
                guard self.decidingSlots.wait(timeout: .now()) == .success else {
                    return responder.respond(
                        Problem(
                            503, "busy", "Service Unavailable",
                            "\(Self.maxDeciding) batches across instances are being decided here right now; retry shortly",
                            headers: [("Retry-After", "1")]
                        ).response)
                }
                // Parts may be committed at the owners any moment: answer, never 503, at shutdown.
                guard responder.answerBeforeShutdown() else {
                    self.decidingSlots.signal()
                    return
                }
                self.deciding.async {
                    defer { self.decidingSlots.signal() }
                    responder.respond(self.run(request, elements, key: found))
                }
            })
    }

    /// The whole exchange (blocking: it runs on `deciding`).
    private func run(_ request: HTTPRequest, _ elements: [BatchElement], key: (scope: String, bodyHash: [UInt8])?) -> HTTPResponse {
        let deadline = DispatchTime.now() + Self.retryWindow
        if let key {
            do {
                if let done = try store.batch(withKey: key.scope) { return replay(done, key: key, request, elements, deadline: deadline) }
            } catch {
                return StoreReadUnavailable(detail: "\(error)").problem.response
            }
        }
        var last = Problem.noOwner("the queues of this batch are moving; retry shortly").response
        while DispatchTime.now() < deadline {
            let id = SHA256.hex((0..<16).map { _ in UInt8.random(in: 0...255) })
            switch attempt(id, request, elements, key: key, deadline: deadline) {
            case let .answer(response): return response
            case let .again(response):
                last = response
                pause(0.025)
            }
        }
        return last
    }

    private enum Attempt {
        /// The client's answer.
        case answer(HTTPResponse)
        /// Partitions moved under it, nothing was committed: try again with a new id (this is
        /// the answer when time is up).
        case again(HTTPResponse)
    }

    /// One owner's answer to a prepare.
    private struct Prepared {
        let url: String
        let instance: String
        let indices: [Int]
        let ids: [OperationID]
        let scopes: [String]
        let epochs: [Int64]
    }

    private func attempt(
        _ id: String, _ request: HTTPRequest, _ elements: [BatchElement], key: (scope: String, bodyHash: [UInt8])?, deadline: DispatchTime
    ) -> Attempt {
        guard let urls = holders(of: Set(elements.map(\.queue))) else {
            return .again(Problem.noOwner("a queue of this batch has no holder right now (its partition is moving); retry shortly").response)
        }
        let answers = exchange(request, phase: "prepare \(id)", with: urls.sorted(), body: request.body)
        var prepared: [Prepared] = []
        var refusals: [(index: Int, response: HTTPResponse)] = []
        var failed: HTTPResponse?
        for (url, result) in answers {
            if case let .success(a) = result, a.status == 200, let p = Self.prepared(a.body, url: url) {
                prepared.append(p)
            } else if case let .success(a) = result, (400..<500).contains(a.status), !a.truncated {
                refusals.append((Self.elementIndex(a.body) ?? Int.max, Forwarder.relay(result, maxResponseBytes: forwarder.maxResponseBytes)))
            } else {
                failed = failed ?? Forwarder.relay(result, maxResponseBytes: forwarder.maxResponseBytes)
            }
        }
        if let refusal = refusals.min(by: { $0.index < $1.index }) {
            letGo(id, prepared, request)
            return .answer(refusal.response)
        }
        if let failed {
            letGo(id, prepared, request)
            return .again(failed)
        }
        // Every element set aside by exactly one owner.
        var ids = [OperationID?](repeating: nil, count: elements.count)
        for p in prepared {
            for (i, opID) in zip(p.indices, p.ids) where elements.indices.contains(i) {
                if ids[i] != nil { ids[i] = OperationID(raw: 0) } else { ids[i] = opID }
            }
        }
        guard ids.allSatisfy({ $0 != nil && $0 != OperationID(raw: 0) }) else {
            letGo(id, prepared, request)
            return .again(Problem.noOwner("the queues of this batch moved while it was checked; retry shortly").response)
        }
        let all = ids.compactMap { $0 }
        var parts: [Int: [OperationID]] = [:]
        for (i, e) in elements.enumerated() { parts[QueuePartitions.of(queue: e.queue), default: []].append(all[i]) }
        let decision = BatchDecision(
            id: id, idem: key?.scope, bodyHash: key?.bodyHash, body: request.body, ids: all,
            parts: parts.keys.sorted().map { ($0, parts[$0] ?? []) },
            fences: prepared.filter { !$0.scopes.isEmpty }.map { ($0.instance, $0.scopes, $0.epochs) })
        let outcome: BatchDecisionOutcome
        do { outcome = try store.decideBatch(decision) } catch {
            // Committed or not: each owner reads which when told to let go, and adds its part
            // if it was.
            letGo(id, prepared, request)
            return .answer(
                Problem(
                    503, "owner-unavailable", "Service Unavailable",
                    "the batch's commit could not be confirmed (\(error)); it may or may not have happened. Retry it; send an Idempotency-Key so that a retried batch happens once",
                    headers: [("Retry-After", "1")]
                ).response)
        }
        switch outcome {
        case .committed:
            // Its own time to be added: committed late in the retries, it is still answered.
            return .answer(collect(id, request, elements, ids: all, deadline: .now() + Self.retryWindow, replayed: false))
        case .aborted, .fenced:
            letGo(id, prepared, request)
            return .again(Problem.noOwner("the queues of this batch moved while it was decided; retry shortly").response)
        case let .sameKey(other):
            letGo(id, prepared, request)
            guard let key else { return .again(Problem.noOwner("retry shortly").response) }
            return .answer(replay((other, key.bodyHash), key: key, request, elements, deadline: deadline))
        }
    }

    /// The answer for the committed batch `done` made under the same Idempotency-Key.
    private func replay(
        _ done: (id: String, bodyHash: [UInt8]), key: (scope: String, bodyHash: [UInt8]), _ request: HTTPRequest, _ elements: [BatchElement],
        deadline: DispatchTime
    ) -> HTTPResponse {
        guard done.bodyHash == key.bodyHash else {
            return Problem(422, "invalid-field", "Invalid field", "Idempotency-Key: was already used with a different request body").response
        }
        let batch: CommittedBatch?
        do { batch = try store.committedBatch(done.id) } catch { return StoreReadUnavailable(detail: "\(error)").problem.response }
        guard let batch, batch.ids.count == elements.count else {
            return Problem(503, "store-unavailable", "Service Unavailable", "the batch kept for this Idempotency-Key cannot be read; retry shortly").response
        }
        return collect(done.id, request, elements, ids: batch.ids, deadline: deadline, replayed: true)
    }

    /// Every part of committed batch `id` added and durable, asked of the holder of each queue
    /// until each has answered (its statuses) or `deadline` passes; then 201 with every status
    /// in the batch's order.
    private func collect(
        _ id: String, _ request: HTTPRequest, _ elements: [BatchElement], ids: [OperationID], deadline: DispatchTime, replayed: Bool
    ) -> HTTPResponse {
        var statuses = [JSONValue?](repeating: nil, count: elements.count)
        // At least one round, however late.
        var first = true
        while first || DispatchTime.now() < deadline {
            first = false
            let missing = Set(elements.indices.filter { statuses[$0] == nil }.map { elements[$0].queue })
            if let urls = holders(of: missing) {
                for (_, result) in exchange(request, phase: "apply \(id)", with: urls.sorted(), body: []) {
                    guard case let .success(a) = result, a.status == 200, !a.truncated, let v = try? JSONValue.parse(a.body),
                        case let .array(indices)? = v["indices"], case let .array(list)? = v["operations"], indices.count == list.count
                    else { continue }
                    for (n, s) in zip(indices, list) {
                        if case let .number(d) = n, let i = Int(exactly: d), statuses.indices.contains(i) { statuses[i] = s }
                    }
                }
            }
            if statuses.allSatisfy({ $0 != nil }) {
                let body = JSONValue.object([("operations", .array(statuses.map { $0 ?? .null }))])
                return json(201, body.bytes, replayed ? [("Idempotent-Replayed", "true")] : [])
            }
            pause(0.025)
        }
        logger.warning("a committed batch across instances was not confirmed by every owner in time", metadata: ["batch": "\(id)"])
        return Problem(
            503, "owner-unavailable", "Service Unavailable",
            "the batch is committed and its operations will all exist (ids \(ids.map(\.description).joined(separator: ", "))), but not every owner confirmed its part in time; read them, or retry with the same Idempotency-Key",
            headers: [("Retry-After", "1")]
        ).response
    }

    /// Each prepared owner lets its part go (it reads the outcome first: see `resolve`).
    private func letGo(_ id: String, _ prepared: [Prepared], _ request: HTTPRequest) {
        guard !prepared.isEmpty else { return }
        _ = exchange(request, phase: "abort \(id)", with: prepared.map(\.url), body: [])
    }

    /// The base URL of each queue's holder (this instance's own for its queues); nil when one
    /// has none right now.
    private func holders(of queues: Set<String>) -> Set<String>? {
        var urls = Set<String>()
        for q in queues {
            if owner.serves(queue: q) {
                urls.insert(owner.selfURL)
            } else if let h = owner.holder(ofQueue: q), !h.url.isEmpty {
                urls.insert(h.url)
            } else {
                return nil
            }
        }
        return urls
    }

    /// `phase` asked of every instance at `urls` at once; their answers by URL.
    private func exchange(
        _ request: HTTPRequest, phase: String, with urls: [String], body: [UInt8]
    ) -> [(String, Result<OutboundResponse, OutboundError>)] {
        let results = Locking.Lock<[(String, Result<OutboundResponse, OutboundError>)]>([])
        let group = DispatchGroup()
        for url in urls {
            var out = forwarder.outboundRequest(for: request, base: url)
            out.headers.append((Self.phaseHeader, phase))
            out.body = body
            out.timeout = Self.exchangeSeconds
            group.enter()
            forwarder.client.send(out) { result in
                results.withLock { $0.append((url, result)) }
                group.leave()
            }
        }
        group.wait()
        return results.withLock { $0 }
    }

    /// An owner's answer to a prepare; nil when it is not one.
    private static func prepared(_ body: [UInt8], url: String) -> Prepared? {
        guard let v = try? JSONValue.parse(body), case let .string(instance)? = v["instance"], case let .array(indices)? = v["indices"],
            case let .array(ids)? = v["ids"], case let .array(scopes)? = v["scopes"], case let .array(epochs)? = v["epochs"],
            indices.count == ids.count, scopes.count == epochs.count
        else { return nil }
        var p = Prepared(url: url, instance: instance, indices: [], ids: [], scopes: [], epochs: [])
        var list: [Int] = []
        var opIDs: [OperationID] = []
        for (n, i) in zip(indices, ids) {
            guard case let .number(d) = n, let index = Int(exactly: d), case let .string(text) = i, let opID = OperationID(text) else { return nil }
            list.append(index)
            opIDs.append(opID)
        }
        var names: [String] = []
        var numbers: [Int64] = []
        for (s, e) in zip(scopes, epochs) {
            guard case let .string(scope) = s, case let .number(d) = e, let epoch = Int64(exactly: d) else { return nil }
            names.append(scope)
            numbers.append(epoch)
        }
        p = Prepared(url: url, instance: instance, indices: list, ids: opIDs, scopes: names, epochs: numbers)
        return p
    }

    /// The element a refusal names (`operations[3]…` in its detail); nil: the batch as a whole.
    static func elementIndex(_ body: [UInt8]) -> Int? {
        guard let v = try? JSONValue.parse(body), case let .string(detail)? = v["detail"], detail.hasPrefix("operations[") else { return nil }
        let digits = detail.dropFirst("operations[".count).prefix { $0.isASCII && $0.isNumber }
        return digits.count <= 9 ? Int(digits) : nil
    }
}

/// Waits `seconds` (a fraction of a second) on the calling thread.
private func pause(_ seconds: Double) { usleep(useconds_t(seconds * 1_000_000)) }
