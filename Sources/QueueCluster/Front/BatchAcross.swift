import Digest
import Dispatch
import Locking
import Logging
import MicroHTTP
import OutboundHTTP
import PostgresStore
import QueueAPI
import QueueEngine

/// `POST /v1/operations:batch` over queues that different instances hold (API.md "Many
/// instances": committed atomically, as on one instance). The instance that receives it
/// decides it with the owners, in two steps (`QueueEngine+BatchParts`):
///
/// 1. **Prepare.** Every owner is sent the whole batch with `Opqd-Batch: prepare <id>`. It
///    checks the elements of the queues it holds as a batch is checked on one instance, sets an
///    id aside for each, and answers them with the epochs of their partitions. Nothing is
///    added or written; no event. A refusal names its element as on one instance: the first
///    one refused (the lowest index) is the answer, and every owner lets its part go.
/// 2. **Decide.** One PostgreSQL transaction, fenced by each owner's partitions at those epochs,
///    writes the batch's row (`opqd.batches`, outcome 'commit', with its body and ids) and one
///    row per partition (`opqd.batch_parts`). That commit is the batch's; before it nothing
///    happened anywhere, after it every part is added: by its owner when told
///    (`Opqd-Batch: apply <id>`), by the next holder of its partition when it takes the
///    partition (`pending`), or by the owner itself when nobody tells it within
///    `decisionWait` (it then writes the batch off unless it is committed: the first of the
///    two rows wins). Each part is added once: the commit that adds it deletes its partition's
///    row (`StoreRecord.batchPartAdded`, fenced like every commit), and an operation whose id
///    exists here is not added again.
///
/// The answer is 201 with every element's status in order once every part is added and
/// durable. While partitions move (a prepare that finds a queue gone, a fence that fails) the
/// whole exchange is tried again with a new id, for up to `retryWindow` seconds.
///
/// With an `Idempotency-Key`, the batch's row keeps the key (one committed batch per key): a
/// repeat answers the statuses of the batch committed first (`Idempotent-Replayed: true`); the
/// same key with another body is refused.
package final class BatchAcross: Sendable {
    /// The phase an owner is asked for: `prepare <id>`, `apply <id>` or `abort <id>`.
    static let phaseHeader = "opqd-batch"
    /// Seconds an owner holds a prepared part without hearing the outcome, before it looks.
    static let decisionWait = 10.0
    /// Seconds the whole exchange is tried again while partitions move, and the parts' adding
    /// is waited for.
    static let retryWindow = 5.0
    /// Seconds one exchange with one owner may take.
    static let exchangeSeconds = 8.0

    let engine: QueueEngine
    let store: PostgresStore
    let parser: BatchParser
    let owner: PartitionOwner
    let forwarder: Forwarder
    let access: Access
    let logger: Logger
    /// Where an owner adds, lets go and looks up parts (PostgreSQL reads: never on a server
    /// thread, never on the shared pool), one at a time.
    let parts = DispatchQueue(label: "opqd.batch-parts")
    /// Where batches are decided: each holds its thread while it waits for the owners.
    let deciding = DispatchQueue(label: "opqd.batch-decide", attributes: .concurrent)
    /// Batches being decided at once, at most (more: 503, retry).
    let decidingSlots = DispatchSemaphore(value: BatchAcross.maxDeciding)
    static let maxDeciding = 16

    package init(
        engine: QueueEngine, store: PostgresStore, parser: BatchParser, owner: PartitionOwner, forwarder: Forwarder, access: Access, logger: Logger
    ) {
        self.engine = engine
        self.store = store
        self.parser = parser
        self.owner = owner
        self.forwarder = forwarder
        self.access = access
        self.logger = logger
    }

    // MARK: - the owner's side

    /// A phase asked of this instance by the one deciding a batch (`phaseHeader`).
    func participate(_ phase: String, _ request: HTTPRequest) -> HTTPHandlerResult {
        let words = phase.split(separator: " ", omittingEmptySubsequences: true)
        guard request.method == "POST", request.path == "/v1/operations:batch", words.count == 2, let id = Self.validID(words[1]) else {
            return .response(
                Problem.badRequest("\(Self.phaseHeader): must be 'prepare <id>', 'apply <id>' or 'abort <id>' on POST /v1/operations:batch").response)
        }
        if let refused = access.refusal(request, match: .notFound) { return .response(refused.response) }
        switch words[0] {
        case "prepare": return .response(prepare(id, request))
        case "apply":
            return .deferred { responder in
                guard responder.answerBeforeShutdown() else { return }
                self.parts.async { self.apply(id, responder) }
            }
        case "abort":
            return .deferred { responder in
                guard responder.answerBeforeShutdown() else { return }
                self.parts.async {
                    self.resolve(id)
                    responder.respond(HTTPResponse(status: 204, headers: [], body: []))
                }
            }
        default:
            return .response(Problem.badRequest("\(Self.phaseHeader): must be 'prepare <id>', 'apply <id>' or 'abort <id>'").response)
        }
    }

    /// Step 1 at an owner: its part checked and its ids set aside, or the refusal. A batch with
    /// no element here sets nothing aside.
    private func prepare(_ id: String, _ request: HTTPRequest) -> HTTPResponse {
        let elements: [BatchElement]
        do { elements = try parser.batchElements(request) } catch { return Problem.from(error, requestID: request.id).response }
        let mine = elements.indices.filter { owner.serves(queue: elements[$0].queue) }
        let ids: [OperationID]
        do { ids = try engine.prepareBatchPart(id, elements, mine: mine) } catch {
            return OperationsController.naming(element: error.index, error.error).response
        }
        let held = owner.held.all
        var scopes: [JSONValue] = []
        var epochs: [JSONValue] = []
        for p in Set(mine.map { QueuePartitions.of(queue: elements[$0].queue) }).sorted() {
            guard let epoch = held[p] else {
                // Never answered: nobody can commit these ids.
                engine.releaseBatchPart(id, giveIDsBack: true)
                return Problem.noOwner("a partition of this batch is moving; retry shortly").response
            }
            scopes.append(.string(QueuePartitions.scope(p)))
            epochs.append(.number(Double(epoch)))
        }
        if !mine.isEmpty { parts.asyncAfter(deadline: .now() + Self.decisionWait) { [self] in resolve(id) } }
        let body = JSONValue.object([
            ("instance", .string(owner.selfID)),
            ("indices", .array(mine.map { .number(Double($0)) })),
            ("ids", .array(ids.map { .string($0.description) })),
            ("scopes", .array(scopes)),
            ("epochs", .array(epochs)),
        ])
        return json(200, body.bytes)
    }

    /// Step 2 at an owner: the parts of committed batch `id` in the partitions it serves are
    /// added (once), and the statuses of its elements here answered once durable.
    private func apply(_ id: String, _ responder: HTTPResponder) {
        let batch: CommittedBatch?
        let pending: Set<Int>
        do {
            batch = try store.committedBatch(id)
            pending = Set(try store.pendingParts(of: id))
        } catch {
            return responder.respond(StoreReadUnavailable(detail: "\(error)").problem.response)
        }
        guard let batch else {
            return responder.respond(Problem(409, "batch-not-committed", "Batch not committed", "batch \(id) is not committed").response)
        }
        let statuses: [Int: OperationSnapshot]
        do { statuses = try add(id, batch, pending: pending) { owner.serves(queue: $0) } } catch {
            return responder.respond(Problem.from(error, requestID: 0).response)
        }
        let indices = statuses.keys.sorted()
        let body = JSONValue.object([
            ("indices", .array(indices.map { .number(Double($0)) })),
            ("operations", .array(indices.map { (try? JSONValue.parse(statuses[$0]?.json ?? [])) ?? .null })),
        ])
        engine.whenDurable { responder.respond(json(200, body.bytes)) }
    }

    /// Adds the parts of committed `batch` still `pending` whose queues `serves` says are here
    /// (each part, its rows' removal with it, in one change), and answers the statuses of every
    /// element here, by index.
    private func add(_ id: String, _ batch: CommittedBatch, pending: Set<Int>, serves: (String) -> Bool) throws -> [Int: OperationSnapshot] {
        let elements = try parser.batchElements(body: batch.body)
        guard elements.count == batch.ids.count else {
            throw BatchDamaged(description: "batch \(id) has \(elements.count) elements and \(batch.ids.count) ids")
        }
        var groups: [Int: [Int]] = [:]
        var here: [Int] = []
        for (i, e) in elements.enumerated() where serves(e.queue) {
            here.append(i)
            let p = QueuePartitions.of(queue: e.queue)
            if pending.contains(p) { groups[p, default: []].append(i) }
        }
        var statuses: [Int: OperationSnapshot] = [:]
        if groups.isEmpty {
            engine.releaseBatchPart(id)
        } else {
            statuses = try engine.applyBatchPart(id, elements, parts: groups.keys.sorted().map { ($0, groups[$0] ?? []) }, ids: batch.ids).statuses
        }
        for (i, op) in engine.batchStatuses(here.filter { statuses[$0] == nil }, ids: batch.ids) { statuses[i] = op }
        return statuses
    }

    /// A prepared part whose outcome this owner has not heard (or was told to let go): the
    /// outcome is read, and written off first when there is none yet. Committed: what is
    /// here of it is added (the rest by the holders of its queues); not: let go, its ids given
    /// back. Looked at again in a second while PostgreSQL cannot be reached.
    func resolve(_ id: String) {
        guard engine.holdsBatchPart(id) else { return }
        do {
            guard try store.writeOffBatch(id) else {
                engine.releaseBatchPart(id, giveIDsBack: true)
                return
            }
            guard let batch = try store.committedBatch(id) else { return }
            _ = try add(id, batch, pending: Set(try store.pendingParts(of: id))) { owner.serves(queue: $0) }
        } catch {
            logger.warning("cannot settle a batch across instances yet; trying again in a second", metadata: ["batch": "\(id)", "error": "\(error)"])
            parts.asyncAfter(deadline: .now() + 1) { [self] in resolve(id) }
        }
    }

    /// For `PartitionOwner.onTake`: the committed batches with parts in `parts` not added yet,
    /// read now; the returned step adds them (right after the partitions' queues are loaded,
    /// before they are served).
    func pending(_ parts: Set<Int>) throws -> (@Sendable () -> Void) {
        let ids = try store.pendingBatches(parts: parts.sorted())
        guard !ids.isEmpty else { return {} }
        var batches: [(id: String, batch: CommittedBatch, parts: Set<Int>)] = []
        for id in ids {
            guard let b = try store.committedBatch(id) else { continue }
            batches.append((id, b, Set(try store.pendingParts(of: id)).intersection(parts)))
        }
        let found = batches
        return { [self] in
            for (id, batch, pending) in found {
                do {
                    let added = try add(id, batch, pending: pending) { pending.contains(QueuePartitions.of(queue: $0)) }
                    logger.info("parts of a batch across instances added with their partitions", metadata: ["batch": "\(id)", "operations": "\(added.count)"])
                } catch {
                    // Only a batch whose body no longer parses (a database edited by hand).
                    logger.error("cannot add a committed batch's part", metadata: ["batch": "\(id)", "error": "\(error)"])
                }
            }
        }
    }

    static func validID(_ word: Substring) -> String? {
        guard (1...64).contains(word.utf8.count), word.utf8.allSatisfy({ ($0 >= 0x30 && $0 <= 0x39) || ($0 >= 0x61 && $0 <= 0x66) }) else { return nil }
        return String(word)
    }
}

/// A committed batch's row that does not match its body (a database edited by hand).
struct BatchDamaged: Error, CustomStringConvertible {
    let description: String
}
