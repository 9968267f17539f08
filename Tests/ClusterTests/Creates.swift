import Foundation
import Locking
import TestKit

#if canImport(Glibc)
import Glibc
#endif

/// What the clients of a test were told: every create answered 201 (an acknowledged, durable
/// operation), the creates never answered (in doubt), and how often an instance said 503 or
/// gave no answer.
final class CreateLedger: Sendable {
    struct Ack: Sendable {
        let key: String
        let id: String
        let queue: String
        let dependencies: [String]
        /// The instance that answered 201, and when the answered attempt was sent and answered.
        let node: Int
        let sentAt: Double
        let answeredAt: Double
        /// 1 when the first attempt was answered.
        let attempts: Int
        let replayed: Bool
    }

    struct State: Sendable {
        var acks: [Ack] = []
        var inDoubt: [String] = []
        var unavailable = 0
        var noAnswer = 0
        var inProgress = 0
        var problems: [String] = []
        var retryAfter: [String] = []
    }

    let state = Lock(State())

    var acks: [Ack] { state.withLock { $0.acks } }
    var ackedIDs: Set<String> { Set(acks.map(\.id)) }
    var problems: [String] { state.withLock { $0.problems } }

    /// Creates one operation in `queue` with `body` (a create body) under `Idempotency-Key: key`,
    /// sending it again with the same key and body on 503 or no answer, to the next of
    /// `targets()`, until 201 or `deadline` (then the create is in doubt). Returns the id.
    @discardableResult
    func create(queue: String, body: String, key: String, dependencies: [String] = [], targets: () -> [ClusterNode], deadline: Double) -> String? {
        var attempt = 0
        while monotonicSeconds() < deadline {
            let nodes = targets()
            guard !nodes.isEmpty else { break }
            let node = nodes[attempt % nodes.count]
            attempt += 1
            let sent = monotonicSeconds()
            let outcome = node.exchange(
                "POST", "/v1/queues/\(queue)/operations", json: body, headers: ["Idempotency-Key": key], timeout: max(1, min(10, deadline - sent)))
            guard let r = outcome.response else {
                state.withLock { $0.noAnswer += 1 }
                usleep(100_000)
                continue
            }
            switch r.status {
            case 201:
                guard let id = r.string("id") else {
                    state.withLock { $0.problems.append("\(key): 201 without an id: \(r.text.prefix(300))") }
                    return nil
                }
                let ack = Ack(
                    key: key, id: id, queue: queue, dependencies: dependencies, node: node.index, sentAt: sent, answeredAt: monotonicSeconds(),
                    attempts: attempt, replayed: r.headers["idempotent-replayed"] == "true")
                state.withLock { $0.acks.append(ack) }
                return id
            case 503:
                let after = r.headers["retry-after"]
                state.withLock { s in
                    s.unavailable += 1
                    if after == nil && s.problems.count < 20 {
                        s.problems.append("\(key): 503 from opqd #\(node.index) without Retry-After: \(r.headers) \(r.text.prefix(200))")
                    }
                    if let after, s.retryAfter.count < 5 { s.retryAfter.append(after) }
                }
                // Honours Retry-After, but polls faster than whole seconds to time the switch.
                usleep(useconds_t(min(Double(after ?? "1") ?? 1, 0.2) * 1e6))
            case 409 where r.string("type")?.hasSuffix("/idempotency-in-progress") == true:
                // The first attempt is still being committed (its answer was lost on the way): the
                // contract's answer is 409 until it is, then a replay.
                state.withLock { $0.inProgress += 1 }
                usleep(100_000)
            default:
                state.withLock { $0.problems.append("\(key) through opqd #\(node.index): \(r.status) \(r.text.prefix(300))") }
                return nil
            }
        }
        state.withLock { $0.inDoubt.append(key) }
        return nil
    }

    /// One line for the test's printout.
    var summary: String {
        state.withLock { s in
            let retried = s.acks.filter { $0.attempts > 1 }.count
            let replayed = s.acks.filter(\.replayed).count
            return "\(s.acks.count) creates acknowledged (\(retried) after a retry, \(replayed) of them replayed by Idempotency-Key), "
                + "\(s.inDoubt.count) in doubt, \(s.unavailable) answers 503 (Retry-After e.g. \(s.retryAfter.first ?? "-")), "
                + "\(s.inProgress) answers 409 idempotency-in-progress, \(s.noAnswer) without an answer"
        }
    }
}

/// Clients creating `delay` operations in one queue through `targets()` until `stop` is set,
/// each on its own thread; `keys` prefix their Idempotency-Keys and names.
final class SteadyLoad: Sendable {
    let ledger = CreateLedger()
    let stop = Lock(false)
    private let done = Lock(0)
    let clients: Int

    init(clients: Int, queue: String, prefix: String, seconds: ClosedRange<Double>, targets: @escaping @Sendable () -> [ClusterNode]) {
        self.clients = clients
        for c in 0..<clients {
            let thread = Thread { [ledger, stop, done] in
                var n = 0
                while !stop.withLock({ $0 }) {
                    let key = "\(prefix)-\(c)-\(n)"
                    n += 1
                    let body = #"{"kind":"delay","name":"\#(key)","spec":{"seconds":\#(Double.random(in: seconds))}}"#
                    ledger.create(queue: queue, body: body, key: key, targets: targets, deadline: monotonicSeconds() + 30)
                    usleep(useconds_t.random(in: 5_000...20_000))
                }
                done.withLock { $0 += 1 }
            }
            thread.stackSize = 1 << 20
            thread.start()
        }
    }

    /// Stops the clients and waits (up to `timeout`) for their last creates to be answered or
    /// given up; returns whether they all stopped.
    func finish(timeout: Double = 40) -> Bool {
        stop.withLock { $0 = true }
        return waitUntil(timeout: timeout, every: 0.01) { done.withLock { $0 } == clients }
    }
}

/// The operations of one queue as its listing shows them.
struct Listing {
    /// Ids by name, in creation order.
    var byName: [String: [String]] = [:]
    /// `state/outcome` by id.
    var status: [String: String] = [:]
    var problems: [String] = []

    /// Lists every operation of `queue` page by page through `node`.
    init(queue: String, through node: ClusterNode) {
        var cursor: String? = nil
        for _ in 0..<100 {
            let target = "/v1/queues/\(queue)/operations?limit=1000" + (cursor.map { "&after=\($0)" } ?? "")
            guard let r = try? node.request("GET", target), r.status == 200 else {
                problems.append("listing \(target) through opqd #\(node.index) failed")
                return
            }
            for o in r.objects("operations") {
                guard let id = o["id"] as? String else { continue }
                byName[o["name"] as? String ?? "", default: []].append(id)
                status[id] = "\(o["state"] as? String ?? "?")/\(o["outcome"] as? String ?? "-")"
            }
            cursor = r.string("next")
            if cursor == nil { return }
        }
        problems.append("listing queue \(queue) took more than 100 pages")
    }

    /// The ids of the operations named by `names` (the keys of creates in doubt).
    func ids(named names: [String]) -> Set<String> { Set(names.flatMap { byName[$0] ?? [] }) }
}

/// Checks after a run under load: every acknowledged create exists in `listed` (the queue's
/// listing), finished and succeeded, and exactly one operation has each name a client used (an
/// Idempotency-Key retry made no second one); a sample of them is also read one by one
/// through `node` (a follower: forwarded or read from PostgreSQL).
func acknowledgedProblems(_ ledger: CreateLedger, listed: Listing, through node: ClusterNode) -> [String] {
    var problems = listed.problems
    let acks = ledger.acks
    for ack in acks {
        guard let ids = listed.byName[ack.key] else {
            problems.append("\(ack.id) (\(ack.key)): acknowledged by opqd #\(ack.node), but not in the queue's listing")
            continue
        }
        if ids != [ack.id] { problems.append("\(ack.key): acknowledged as \(ack.id), but the queue holds \(ids) with that name") }
        if listed.status[ack.id] != "finished/succeeded" {
            problems.append("\(ack.id) (\(ack.key)): \(listed.status[ack.id] ?? "?"), expected finished/succeeded")
        }
    }
    for (name, ids) in listed.byName where ids.count > 1 && !acks.contains(where: { $0.key == name }) {
        problems.append("\(name) (never acknowledged): \(ids.count) operations with that name: \(ids)")
    }
    for ack in acks.shuffled().prefix(25) {
        guard let r = try? node.request("GET", "/v1/operations/\(ack.id)"), r.status == 200 else {
            problems.append("\(ack.id): GET /v1/operations/\(ack.id) through opqd #\(node.index) is not 200")
            continue
        }
        if r.string("state") != "finished" || r.string("outcome") != "succeeded" {
            problems.append("\(ack.id): GET through opqd #\(node.index) says \(r.string("state") ?? "?")/\(r.string("outcome") ?? "-")")
        }
    }
    return problems
}
