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
///    two rows wins). Each part is added once: an operation whose id exists is not added again.
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
        guard request.method == "POST", words.count == 2, let id = Self.validID(words[1]) else {
            return .response(Problem.badRequest("\(Self.phaseHeader): must be 'prepare <id>', 'apply <id>' or 'abort <id>'").response)
        }
        if let refused = access.refusal(request, match: .notFound) { return .response(refused.response) }
        switch words[0] {
        case "prepare": return .response(prepare(id, request))
        case "apply":
            return .deferred { responder in
                responder.answerBeforeShutdown()
                DispatchQueue.global().async { self.apply(id, responder) }
            }
        case "abort":
            return .deferred { responder in
                responder.answerBeforeShutdown()
                DispatchQueue.global().async {
                    self.resolve(id)
                    responder.respond(HTTPResponse(status: 204, headers: [], body: []))
                }
            }
        default:
            return .response(Problem.badRequest("\(Self.phaseHeader): must be 'prepare <id>', 'apply <id>' or 'abort <id>'").response)
        }
    }

    /// Step 1 at an owner: its part checked and its ids set aside, or the refusal.
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
                engine.releaseBatchPart(id)
                return Problem.noOwner("a partition of this batch is moving; retry shortly").response
            }
            scopes.append(.string(QueuePartitions.scope(p)))
            epochs.append(.number(Double(epoch)))
        }
        DispatchQueue.global().asyncAfter(deadline: .now() + Self.decisionWait) { [self] in resolve(id) }
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
    /// added (once), and their statuses answered once durable.
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
        let added: (indices: [Int], statuses: [OperationSnapshot], parts: [Int])
        do {
            added = try add(id, batch, pending: pending) { owner.serves(queue: $0) }
        } catch {
            return responder.respond(Problem.from(error, requestID: 0).response)
        }
        let body = JSONValue.object([
            ("indices", .array(added.indices.map { .number(Double($0)) })),
            ("operations", .array(added.statuses.map { (try? JSONValue.parse($0.json)) ?? .null })),
        ])
        engine.whenDurable { [self] in
            responder.respond(json(200, body.bytes))
            forget(id, parts: added.parts)
        }
    }

    /// Adds the elements of committed `batch` whose queues `serves` says are here: those of
    /// partitions still `pending` are added (unless they exist already); the others' statuses
    /// are answered as they are. Returns the indices answered, their statuses, and the pending
    /// partitions added.
    private func add(
        _ id: String, _ batch: CommittedBatch, pending: Set<Int>, serves: (String) -> Bool
    ) throws -> (indices: [Int], statuses: [OperationSnapshot], parts: [Int]) {
        let elements = try parser.batchElements(body: batch.body)
        guard elements.count == batch.ids.count else {
            throw BatchDamaged(description: "batch \(id) has \(elements.count) elements and \(batch.ids.count) ids")
        }
        let here = elements.indices.filter { serves(elements[$0].queue) }
        let adding = here.filter { pending.contains(QueuePartitions.of(queue: elements[$0].queue)) }
        var byIndex: [Int: OperationSnapshot] = [:]
        if !adding.isEmpty {
            let made = try engine.applyBatchPart(id, elements, mine: adding, ids: batch.ids)
            for op in made { if let i = batch.ids.firstIndex(of: op.id) { byIndex[i] = op } }
        } else {
            engine.releaseBatchPart(id)
        }
        let others = here.filter { byIndex[$0] == nil }
        for (i, op) in zip(others, engine.operations(others.map { batch.ids[$0] })) { if let op { byIndex[i] = op } }
        let indices = here.filter { byIndex[$0] != nil }
        return (indices, indices.compactMap { byIndex[$0] }, Set(adding.map { QueuePartitions.of(queue: elements[$0].queue) }).sorted())
    }

    /// A prepared part whose outcome this owner has not heard (or was told to let go): the
    /// outcome is read, and written off first when there is none yet. Committed: the part is
    /// added; not: let go. Looked at again in a second while PostgreSQL cannot be reached.
    func resolve(_ id: String) {
        guard engine.holdsBatchPart(id) else { return }
        do {
            guard try store.writeOffBatch(id) else {
                engine.releaseBatchPart(id)
                return
            }
            guard let batch = try store.committedBatch(id) else { return }
            let pending = Set(try store.pendingParts(of: id))
            let added = try add(id, batch, pending: pending) { owner.serves(queue: $0) }
            engine.whenDurable { [self] in forget(id, parts: added.parts) }
        } catch EngineError.notHere {
            // Its queues moved: their next holder adds the part when it takes them.
            engine.releaseBatchPart(id)
        } catch {
            logger.warning("cannot settle a batch across instances yet; trying again in a second", metadata: ["batch": "\(id)", "error": "\(error)"])
            DispatchQueue.global().asyncAfter(deadline: .now() + 1) { [self] in resolve(id) }
        }
    }

    /// The partitions' rows of an added part go (their operations are committed).
    private func forget(_ id: String, parts: [Int]) {
        guard !parts.isEmpty else { return }
        DispatchQueue.global().async { [self] in
            do { try store.forgetBatchParts(id, parts: parts) } catch {
                // Read again at the next take of these partitions: their operations exist, so
                // nothing is added twice.
                logger.warning("cannot clear the parts of a batch across instances", metadata: ["batch": "\(id)", "error": "\(error)"])
            }
        }
    }

    /// For `PartitionOwner.onTake`: the committed batches with parts in `parts` not added yet,
    /// read now; the returned step adds them (right after the partitions' queues are loaded).
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
                    logger.info(
                        "parts of a batch across instances added with their partitions", metadata: ["batch": "\(id)", "operations": "\(added.indices.count)"])
                    engine.whenDurable { [self] in forget(id, parts: added.parts) }
                } catch {
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
