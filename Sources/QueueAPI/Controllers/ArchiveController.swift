import MicroHTTP
import QueueEngine

/// `NSSecureCoding` for a queue: `GET /v1/queues/{name}/archive` exports its settings and every
/// unfinished operation as one versioned JSON document; `POST` restores such a document into a
/// queue that does not exist or has no unfinished operation, all or nothing, in one commit.
///
/// The document (format `opqd-archive/1`; a change that reads old archives differently is a new
/// format name, and this one must keep restoring: see the golden fixture in the tests):
/// ```
/// {"format":"opqd-archive/1","exportedAt":"<RFC 3339>",
///  "queue":{"name","maxConcurrentOperationCount","isSuspended","rateLimit"?,"fairnessWeights"?},
///  "operations":[{"id","name"?,"kind","spec"?,"queuePriority","dependencies":[ids],
///                 "isPaused","attempt","timeout"?,"retry"?,"notBefore"?,"limits"?,"fairnessKey"?,"createdAt"}…]}
/// ```
/// Operations are in creation order (the order the queue starts those of equal priority), with
/// only their unfinished dependencies.
/// Both directions are bounded by `--max-batch` operations, and an export by `--max-body` bytes
/// (what a restore accepts): past either the answer is 422 `archive-too-large`.
package struct ArchiveController: Sendable {
    let engine: QueueEngine
    let durability: Durability
    /// Its create-body parsing (kind, spec, options) is the archive's too.
    let operations: OperationsController
    let limits: APILimits
    /// `--max-body`: the largest document a restore can read, so the largest an export makes.
    let maxBody: Int
    /// This server's identity (kept in its store): an archive says where it was made, and
    /// ids of operations outside it mean something only there. Restored on another server
    /// they are dropped (ids are per server: kept, they would name unrelated operations).
    let serverID: String

    static let format = "opqd-archive/1"
    static let documentFields = ["format", "exportedAt", "exportedFrom", "queue", "operations"]
    static let queueFields = ["name", "maxConcurrentOperationCount", "isSuspended", "rateLimit", "fairnessWeights"]
    static let operationFields = [
        "id", "name", "kind", "spec", "queuePriority", "dependencies", "isPaused", "attempt", "timeout", "retry", "notBefore", "limits",
        "fairnessKey", "createdAt",
    ]
    /// A barrier has no spec or options of its own.
    static let barrierFields = ["id", "name", "kind", "queuePriority", "dependencies", "isPaused", "attempt", "createdAt"]

    package func addRoutes(to r: inout Router) {
        r.add("GET", "/v1/queues/{name}/archive", scope: .queue(param: 0)) { req, p in try export(req, p[0]) }
        r.add("POST", "/v1/queues/{name}/archive", scope: .queue(param: 0)) { req, p in try durability.idempotent(req) { try restore(req, p[0]) } }
    }

    static func tooLarge(_ detail: String) -> Problem { Problem(422, "archive-too-large", "Archive too large", detail) }

    // MARK: - export

    func export(_ req: HTTPRequest, _ name: String) throws -> HTTPHandlerResult {
        _ = try Query(req, allowed: [])
        // One locked read: the settings and every operation as they were at one instant.
        let archive = try engine.archive(queue: name, limit: limits.batch)
        guard archive.unfinished <= limits.batch else {
            throw Self.tooLarge(
                "queue '\(name)' has \(archive.unfinished) unfinished operations; an archive holds at most \(limits.batch) (--max-batch)")
        }
        var o = JSONOut(capacity: min(maxBody, 512 * archive.operations.count + 256))
        o.open()
        o.key("format"); o.string(Self.format)
        o.key("exportedAt"); o.time(SystemClock().now())
        o.key("exportedFrom"); o.string(serverID)
        o.key("queue"); o.open()
        o.key("name"); o.string(archive.queue.name)
        o.key("maxConcurrentOperationCount"); o.int(archive.queue.maxConcurrentOperationCount)
        o.key("isSuspended"); o.bool(archive.queue.isSuspended)
        if let r = archive.queue.rateLimit { o.key("rateLimit"); r.write(to: &o) }
        if !archive.queue.fairnessWeights.isEmpty {
            o.key("fairnessWeights"); o.weights(archive.queue.fairnessWeights)
        }
        o.close()
        o.key("operations"); o.openArray()
        for op in archive.operations {
            Self.write(op, to: &o)
            // Checked as it grows: an oversized answer is refused before it is all built.
            guard o.bytes.count <= maxBody else {
                throw Self.tooLarge("the archive of queue '\(name)' is over \(maxBody) bytes, more than a restore accepts (--max-body)")
            }
        }
        o.closeArray()
        o.close()
        return .response(json(200, o.bytes))
    }

    /// One operation of an archive. An executing one is written as one to run again: its state
    /// is not kept, only whether it is paused and the attempt it is at.
    static func write(_ op: OperationSnapshot, to o: inout JSONOut) {
        o.open()
        o.key("id"); o.string(op.id.description)
        if let name = op.name { o.key("name"); o.string(name) }
        o.key("kind"); o.string(op.kind)
        if let spec = op.spec { o.key("spec"); o.value(spec) }
        o.key("queuePriority"); o.string(op.queuePriority.name)
        o.key("dependencies"); o.openArray()
        for d in op.dependencies { o.string(d.description) }
        o.closeArray()
        o.key("isPaused"); o.bool(op.state == .paused)
        o.key("attempt"); o.int(op.attempt)
        if let t = op.options.timeout { o.key("timeout"); o.number(t) }
        if let r = op.options.retry {
            o.key("retry"); o.open()
            o.key("maxAttempts"); o.int(r.maxAttempts)
            o.key("backoff"); o.number(r.backoff)
            o.key("multiplier"); o.number(r.multiplier)
            o.close()
        }
        if let nb = op.options.notBefore { o.key("notBefore"); o.time(nb) }
        if !op.options.limits.isEmpty {
            o.key("limits"); o.limits(op.options.limits)
        }
        if let f = op.options.fairnessKey { o.key("fairnessKey"); o.string(f) }
        o.key("createdAt"); o.time(op.createdAt)
        o.close()
    }

    // MARK: - restore

    func restore(_ req: HTTPRequest, _ name: String) throws -> HTTPResponse {
        _ = try Query(req, allowed: [])
        guard !req.body.isEmpty else { throw Problem.badRequest("a JSON object body is required: an archive from GET on this path") }
        let document: JSONValue
        do { document = try JSONValue.parse(req.body) } catch { throw Problem.badRequest(error.description) }
        guard case .object = document else { throw Problem.invalid("body", "must be a JSON object; got \(document.typeName)") }
        // The format before the fields: a foreign or newer document is named as such, not by
        // its first field this format does not have.
        guard let f = document["format"] else { throw Problem.invalid("format", "is required: \"\(Self.format)\"") }
        guard case let .string(format) = f, format == Self.format else {
            throw Problem.invalid("format", "must be \"\(Self.format)\" (the archive format this server reads); got \(Self.short(f))")
        }
        let b = try Body(document, field: "body", allowed: Self.documentFields)
        if let e = b["exportedAt"] { _ = try parseTime(e, field: "exportedAt") }
        // Made on another server: its outside dependencies name operations of that server.
        var foreign = false
        if let e = b["exportedFrom"] {
            guard case let .string(s) = e, !s.isEmpty, s.utf8.count <= 128 else {
                throw Problem.invalid("exportedFrom", "must be the id of the server that made the archive (1 to 128 bytes); got \(Self.short(e))")
            }
            foreign = s != serverID
        }
        let (maxConcurrent, suspended, rate, weights) = try parseQueue(b["queue"])
        guard let list = b["operations"] else { throw Problem.invalid("operations", "is required: an array of at most \(limits.batch) operations") }
        guard case let .array(items) = list else { throw Problem.invalid("operations", "must be an array of operations; got \(list.typeName)") }
        // Counted before any element is looked at, like a batch.
        guard items.count <= limits.batch else {
            throw Self.tooLarge("operations: at most \(limits.batch) operations per archive (--max-batch); got \(items.count)")
        }
        // The archive's own ids first, so a dependency may name an element before or after it.
        var index: [String: Int] = [:]
        index.reserveCapacity(items.count)
        var oldIDs: [String] = []
        oldIDs.reserveCapacity(items.count)
        for (i, item) in items.enumerated() {
            guard case let .object(members) = item else { throw Problem.invalid("operations[\(i)]", "must be a JSON object; got \(item.typeName)") }
            guard let idValue = members.first(where: { $0.0 == "id" })?.1 else {
                throw Problem.invalid("operations[\(i)].id", "is required: the operation's id where it was exported")
            }
            guard case let .string(id) = idValue, !id.isEmpty else {
                throw Problem.invalid("operations[\(i)].id", "must be a non-empty string; got \(Self.short(idValue))")
            }
            guard id.utf8.count <= 128 else { throw Problem.invalid("operations[\(i)].id", "must be at most 128 bytes") }
            if let other = index[id] { throw Problem.invalid("operations[\(i)].id", "'\(id)' is already the id of operations[\(other)]") }
            index[id] = i
            oldIDs.append(id)
        }
        var elements: [ArchiveElement] = []
        elements.reserveCapacity(items.count)
        for (i, item) in items.enumerated() {
            do {
                elements.append(try parseElement(item, index: index))
            } catch {
                throw OperationsController.naming(element: i, Problem.from(error, requestID: req.id), field: true)
            }
        }
        var foreignDropped: [OperationID] = []
        if foreign {
            var seen = Set<OperationID>()
            for i in elements.indices {
                elements[i].dependencies.removeAll { d in
                    guard case let .operation(id) = d else { return false }
                    if seen.insert(id).inserted { foreignDropped.append(id) }
                    return true
                }
            }
        }
        let restored: ArchiveRestore
        do {
            restored = try engine.restoreArchive(
                into: name, maxConcurrentOperationCount: maxConcurrent, isSuspended: suspended, rateLimit: rate, fairnessWeights: weights, elements)
        } catch {
            switch error {
            case let .queue(.queueNotIdle(queue, n)):
                throw Problem(
                    409, "queue-not-empty", "Queue not empty",
                    "queue '\(queue)' has \(n) unfinished operation(s); an archive is restored only into a queue that does not exist or has none. Nothing was changed"
                )
            case let .queue(e):
                throw e.problem
            case let .element(i, e):
                throw OperationsController.naming(element: i, e)
            }
        }
        var o = JSONOut(capacity: 64 * restored.operations.count + 512)
        o.open()
        o.key("ids"); o.open()
        for (old, op) in zip(oldIDs, restored.operations) {
            o.comma()
            JSONWriter.string(old, to: &o.bytes)
            o.bytes.append(UInt8(ascii: ":"))
            JSONWriter.string(op.id.description, to: &o.bytes)
        }
        o.close()
        o.key("droppedDependencies"); o.openArray()
        for d in foreignDropped + restored.droppedDependencies { o.string(d.description) }
        o.closeArray()
        o.key("queue"); restored.queue.write(to: &o)
        o.close()
        return json(201, o.bytes, [("Location", "/v1/queues/\(restored.queue.name)")])
    }

    /// `queue`: its settings. `name` is read but the path's name wins.
    func parseQueue(_ v: JSONValue?) throws -> (Int, Bool, RateLimit?, [String: Int]) {
        guard let v else { throw Problem.invalid("queue", "is required: {\"name\", \"maxConcurrentOperationCount\", \"isSuspended\"}") }
        guard case .object = v else { throw Problem.invalid("queue", "must be a JSON object; got \(v.typeName)") }
        do throws(Problem) {
            let q = try Body(v, field: "queue", allowed: Self.queueFields)
            _ = try q.string("name", maxLength: 1000)
            let max = try q.int("maxConcurrentOperationCount", in: -1...1_000_000, what: QueuesController.maxConcurrentRule) ?? -1
            if max == 0 { throw Problem.invalid("maxConcurrentOperationCount", "must be \(QueuesController.maxConcurrentRule); got 0") }
            let rate = try q["rateLimit"].flatMap { v throws(Problem) in try FlowParsing.queueRate(v) }
            let weights = try q["fairnessWeights"].map { v throws(Problem) in try FlowParsing.weights(v) } ?? [:]
            return (max, try q.bool("isSuspended") ?? false, rate, weights)
        } catch {
            var p = error
            p.detail = "queue.\(p.detail)"
            throw p
        }
    }

    /// One operation of the document (its `id` already checked).
    func parseElement(_ item: JSONValue, index: [String: Int]) throws -> ArchiveElement {
        let isBarrier = item["kind"] == .string("barrier")
        let e = try Body(item, field: "", allowed: isBarrier ? Self.barrierFields : Self.operationFields)
        var request: OperationRequest
        if isBarrier {
            request = OperationRequest(kind: "barrier")
            // As `POST /v1/queues/{name}/barrier` allows.
            request.name = try e.string("name", maxLength: 1024)
            request.queuePriority = try parsePriority(e["queuePriority"]) ?? .normal
        } else {
            request = try operations.parseRequest(e)
        }
        if let c = e["createdAt"] { _ = try parseTime(c, field: "createdAt") }
        let isPaused = try e.bool("isPaused") ?? false
        let attempt = try e.int("attempt", in: 0...1_000_000, what: "an integer from 0 to 1000000") ?? 0
        var deps: [BatchDependency] = []
        if let d = e["dependencies"] {
            guard case let .array(list) = d else { throw Problem.invalid("dependencies", "must be an array of operation ids; got \(d.typeName)") }
            guard list.count <= limits.dependencies else {
                throw Problem(
                    422, "too-many-dependencies", "Too many dependencies",
                    "dependencies: at most \(limits.dependencies) dependencies per operation (--max-dependencies); got \(list.count)")
            }
            deps.reserveCapacity(list.count)
            for (j, v) in list.enumerated() {
                guard case let .string(s) = v else { throw Problem.invalid("dependencies[\(j)]", "must be an operation id string; got \(v.typeName)") }
                if let k = index[s] {
                    deps.append(.element(k))
                } else if let id = OperationID(s) {
                    deps.append(.operation(id))
                } else {
                    throw Problem.invalid("dependencies[\(j)]", "'\(Self.shortText(s))' is neither the id of an operation in the archive nor an operation id")
                }
            }
        }
        return ArchiveElement(request: request, dependencies: deps, isPaused: isPaused, attempt: attempt, isBarrier: isBarrier)
    }

    /// A value as JSON text, cut short: a problem names what was sent without echoing a megabyte.
    static func short(_ v: JSONValue) -> String { shortText(v.text) }

    static func shortText(_ s: String) -> String {
        s.utf8.count <= 100 ? s : String(decoding: Array(s.utf8.prefix(100)), as: UTF8.self) + "…"
    }
}
