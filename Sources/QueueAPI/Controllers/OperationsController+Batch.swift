import MicroHTTP
import QueueEngine

extension OperationsController {
    /// Fields an element of a batch may have: a create body's, plus its `queue` and `ref`.
    package static let batchElementFields = [
        "ref", "queue", "kind", "name", "queuePriority", "dependencies", "spec", "timeout", "retry", "notBefore", "limits", "fairnessKey",
        "admission",
    ]

    /// `addOperations(_:waitUntilFinished:)`: `{"operations": [{"ref"?, "queue", …create body…}]}`.
    /// Every element is parsed and checked before the engine is asked, and the engine checks
    /// the whole batch again under its lock before adding any of it, in one commit: 201 with
    /// `{"operations": [status…]}` in the request's order once durable, or one problem naming
    /// the element (`operations[3].spec.seconds`) and nothing changed.
    func batch(_ req: HTTPRequest) throws -> HTTPResponse {
        let elements = try batchElements(req)
        let made: [Admitted]
        do {
            made = try engine.admitOperations(elements)
        } catch {
            let problem = Self.naming(element: error.index, error.error)
            // Nothing was made: not kept for an Idempotency-Key, like a create's 404 (`Durability`).
            if case let .queueNotFound(name) = error.error { throw QueueAbsent(queue: name, problem: problem) }
            throw problem
        }
        var o = JSONOut(capacity: 640 * made.count + 32)
        o.open(); o.key("operations"); o.openArray()
        // An element with an admission says what it did (API.md "Admission"); the batch is 201.
        for m in made { m.operation.write(to: &o, admission: m.outcome) }
        o.closeArray()
        o.close()
        return json(201, o.bytes)
    }
}

extension CreateBodyParsing {
    /// A batch's elements, each parsed and checked as a create's body (its problem names it:
    /// `operations[3].spec.seconds`), refs resolved to earlier elements.
    package func batchElements(_ req: HTTPRequest) throws -> [BatchElement] {
        _ = try Query(req, allowed: [])
        return try batchElements(body: req.body, requestID: req.id)
    }

    /// `batchElements` of a body alone (one kept by the store).
    package func batchElements(body: [UInt8], requestID: UInt64 = 0) throws -> [BatchElement] {
        guard !body.isEmpty else { throw Problem.badRequest("a JSON object body is required") }
        let value: JSONValue
        do { value = try JSONValue.parse(body) } catch { throw Problem.badRequest(error.description) }
        let b = try Body(value, field: "body", allowed: ["operations"])
        guard let list = b["operations"] else { throw Problem.invalid("operations", "is required: an array of 1 to \(limits.batch) operations") }
        guard case let .array(items) = list else { throw Problem.invalid("operations", "must be an array of operations; got \(list.typeName)") }
        // Counted before any element is looked at: a body of many tiny elements costs no more
        // than its parse (bounded by --max-body).
        guard items.count <= limits.batch else {
            // 422 like any value out of range (the schema's maxItems), not 413: the body itself
            // was within --max-body.
            throw Problem(
                422, "batch-too-large", "Batch too large",
                "operations: at most \(limits.batch) operations per batch (--max-batch); got \(items.count)")
        }
        guard !items.isEmpty else { throw Problem.invalid("operations", "must hold at least one operation (at most \(limits.batch))") }
        var refs: [String: Int] = [:]
        var elements: [BatchElement] = []
        elements.reserveCapacity(items.count)
        for (i, item) in items.enumerated() {
            do {
                elements.append(try parseElement(item, index: i, refs: &refs))
            } catch {
                throw OperationsController.naming(element: i, Problem.from(error, requestID: requestID), field: true)
            }
        }
        return elements
    }

    /// One element: its queue, its ref (unique in the batch, registered once it is read, so
    /// only later elements can name it) and its create body.
    func parseElement(_ item: JSONValue, index i: Int, refs: inout [String: Int]) throws -> BatchElement {
        let e = try Body(item, field: "", allowed: OperationsController.batchElementFields)
        guard let queueValue = e["queue"] else { throw Problem.invalid("queue", "is required: the name of the queue to add this operation to") }
        guard case let .string(queue) = queueValue else { throw Problem.invalid("queue", "must be a queue name string; got \(queueValue.typeName)") }
        var request = try parseRequest(e)
        request.dependencies = []
        var deps: [BatchDependency] = []
        if let d = e["dependencies"] {
            guard case let .array(list) = d else {
                throw Problem.invalid("dependencies", "must be an array of operation ids or \"ref:<ref>\"; got \(d.typeName)")
            }
            guard list.count <= limits.dependencies else {
                throw Problem(
                    422, "too-many-dependencies", "Too many dependencies",
                    "dependencies: at most \(limits.dependencies) dependencies per operation (--max-dependencies); got \(list.count)")
            }
            deps.reserveCapacity(list.count)
            for (j, v) in list.enumerated() {
                guard case let .string(s) = v else {
                    throw Problem.invalid("dependencies[\(j)]", "must be an operation id or \"ref:<ref>\"; got \(v.typeName)")
                }
                if s.hasPrefix("ref:") {
                    let name = String(s.dropFirst(4))
                    guard let k = refs[name] else {
                        throw Problem.invalid(
                            "dependencies[\(j)]", "'\(s)' names no earlier element of the batch (a ref names an element before the one that depends on it)")
                    }
                    deps.append(.element(k))
                } else {
                    guard let id = OperationID(s) else { throw Problem(404, "not-found", "Not Found", "dependencies[\(j)]: no operation with id '\(s)'") }
                    deps.append(.operation(id))
                }
            }
        }
        if let r = e["ref"] {
            guard case let .string(ref) = r, !ref.isEmpty else { throw Problem.invalid("ref", "must be a non-empty string; got \(r.text)") }
            guard ref.utf8.count <= 128 else { throw Problem.invalid("ref", "must be at most 128 bytes") }
            guard refs[ref] == nil else {
                throw Problem.invalid("ref", "'\(ref)' is already the ref of operations[\(refs[ref] ?? 0)]; refs are unique in a batch")
            }
            refs[ref] = i
        }
        return BatchElement(queue: queue, request: request, dependencies: deps)
    }
}

extension OperationsController {
    /// The problem of element `i`: a field's problem (`spec.seconds: …`) becomes
    /// `operations[i].spec.seconds: …`; a problem of the element as a whole (its queue is
    /// unknown, a limit) says `operations[i]: …`.
    package static func naming(element i: Int, _ p: Problem, field: Bool) -> Problem {
        var p = p
        p.detail = field && !p.detail.hasPrefix(":") ? "operations[\(i)].\(p.detail)" : "operations[\(i)]\(p.detail)"
        return p
    }

    package static func naming(element i: Int, _ error: EngineError) -> Problem {
        switch error {
        case let .queueNotFound(name):
            return Problem(404, "not-found", "Not Found", "operations[\(i)].queue: no queue named '\(name)'")
        case let .operationNotFound(id):
            return Problem(404, "not-found", "Not Found", "operations[\(i)].dependencies: no operation with id '\(id)'")
        case .invalidArgument, .unknownKind, .notPermitted:
            return naming(element: i, error.problem, field: true)
        default:
            var p = error.problem
            p.detail = "operations[\(i)]: \(p.detail)"
            return p
        }
    }
}
