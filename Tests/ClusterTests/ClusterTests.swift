import Foundation
import Locking
import TestKit
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Whether there is a PostgreSQL to run the cluster on; says so on stdout when there is not.
private let hasPostgres: Bool = {
    if TestPostgres.serverURL == nil { print("ClusterTests skipped: \(TestPostgres.missing)") }
    return TestPostgres.serverURL != nil
}()

/// Three real `opqd` processes on one PostgreSQL database, `--lease 2`: one owns every queue,
/// the others forward to it. One test at a time: each runs 3 servers on 2 shared cores, and a
/// starved owner that misses its renewal would fail over for the wrong reason.
@Suite("A cluster of three opqd processes on one PostgreSQL", .serialized, .enabled(if: hasPostgres, "needs OPQD_TEST_POSTGRES_URL (scripts/test.sh sets it)"))
struct ClusterTests {
    // MARK: - exactly once

    struct QueuePlan: Sendable {
        let name: String
        let limit: Int
    }
    static let queues = [QueuePlan(name: "q1", limit: 1), QueuePlan(name: "q2", limit: 2), QueuePlan(name: "q3", limit: 3), QueuePlan(name: "q4", limit: 2)]
    static let priorities = ["veryLow", "low", "normal", "high", "veryHigh"]

    @Test("operations created through all three instances each start once and finish once, in dependency order, within every queue's limit")
    func exactlyOnce() async throws {
        try await TestCluster(name: "once").run(Self.exactlyOnce)
    }

    static func exactlyOnce(_ cluster: TestCluster) throws {
        let clients = 6
        let perClient = 50
        let t0 = monotonicSeconds()
        guard cluster.awaitSpread() else {
            cluster.record(["the instances did not agree within 20 s on a spread of the partitions over all three"], "start")
            return
        }
        let nodes = cluster.nodes
        // Suspended at first, so ready operations pile up and the limits are tested; resumed
        // half-way, while the creates go on.
        for (i, q) in queues.enumerated() { try cluster.createQueue(q.name, maxConcurrent: q.limit, suspended: true, via: nodes[i % nodes.count]) }

        let ledger = CreateLedger()
        // The ids created so far, by any client through any instance: dependencies are drawn from them.
        let pool = Lock<[String]>([])
        let resumed = Lock(false)
        let resumeProblems = Lock<[String]>([])
        let group = DispatchGroup()
        for c in 0..<clients {
            group.enter()
            let thread = Thread {
                defer { group.leave() }
                let home = nodes[c % nodes.count]
                var rng = SystemRandomNumberGenerator()
                for n in 0..<perClient {
                    let queue = queues[Int.random(in: 0..<queues.count, using: &rng)].name
                    var dependencies: [String] = []
                    if Double.random(in: 0..<1, using: &rng) < 0.4 {
                        let known = pool.withLock { $0 }
                        if !known.isEmpty {
                            for _ in 0..<Int.random(in: 1...3, using: &rng) { dependencies.append(known[Int.random(in: 0..<known.count, using: &rng)]) }
                        }
                    }
                    dependencies = Array(Set(dependencies))
                    let key = "once-\(c)-\(n)"
                    let deps = dependencies.map { "\"\($0)\"" }.joined(separator: ",")
                    let seconds = Double(Int.random(in: 5...40, using: &rng)) / 1000
                    let body =
                        #"{"kind":"delay","name":"\#(key)","queuePriority":"\#(priorities.randomElement(using: &rng)!)","#
                        + #""dependencies":[\#(deps)],"spec":{"seconds":\#(seconds)}}"#
                    // The home instance first; another one only if it fails to answer.
                    let targets = [home] + nodes.filter { $0 !== home }
                    if let id = ledger.create(
                        queue: queue, body: body, key: key, dependencies: dependencies, targets: { targets }, deadline: monotonicSeconds() + 30)
                    {
                        pool.withLock { $0.append(id) }
                    }
                    // Half-way through, one client resumes every queue (each through another instance).
                    let total = pool.withLock { $0.count }
                    if total >= clients * perClient / 2,
                        resumed.withLock({ r in
                            defer { r = true }
                            return !r
                        })
                    {
                        for (i, q) in queues.enumerated() {
                            let via = nodes[(i + 1) % nodes.count]
                            let r = via.exchange("POST", "/v1/queues/\(q.name)/resume")
                            if r.status != 200 { resumeProblems.withLock { $0.append("resume \(q.name) through opqd #\(via.index): \(r)") } }
                        }
                    }
                }
            }
            thread.stackSize = 1 << 20
            thread.start()
        }
        guard group.wait(timeout: .now() + 60) == .success else {
            cluster.record(["the clients did not finish their creates within 60 s: \(ledger.summary)"], "creates")
            return
        }
        let created = monotonicSeconds()
        cluster.record(ledger.problems + resumeProblems.withLock { $0 }, "creates")
        if !resumed.withLock({ $0 }) { cluster.record(["the queues were never resumed (\(ledger.acks.count) creates acknowledged)"], "creates") }

        for (i, q) in queues.enumerated() where !cluster.awaitIdle(q.name, through: [nodes[i % nodes.count]] + nodes, timeout: 40) {
            cluster.record(["queue \(q.name) still had unfinished operations after 40 s"], "waiting")
        }
        let finished = monotonicSeconds()

        // Every instance counts the same: all finished, none left.
        var problems: [String] = []
        let perQueue = Dictionary(grouping: ledger.acks, by: \.queue).mapValues(\.count)
        for node in nodes {
            for q in queues {
                guard let r = try? node.request("GET", "/v1/queues/\(q.name)"), r.status == 200 else {
                    problems.append("GET /v1/queues/\(q.name) through opqd #\(node.index) failed")
                    continue
                }
                let counts = r.object["counts"] as? [String: Any] ?? [:]
                let done = (counts["finished"] as? NSNumber)?.intValue
                if r.int("operationCount") != 0 || done != perQueue[q.name, default: 0] {
                    problems.append(
                        "opqd #\(node.index): \(q.name) has operationCount \(r.int("operationCount") ?? -1), finished \(done ?? -1); expected 0 and \(perQueue[q.name, default: 0])"
                    )
                }
            }
        }
        cluster.record(problems, "queue counts")

        let (feeds, feedProblems) = Feed.readAll(from: nodes)
        cluster.record(feedProblems, "the feeds")
        guard let feed = feeds.first?.feed else { return }
        cluster.record(feed.exactlyOnceProblems(expected: ledger.ackedIDs), "exactly once")
        // Dependency order: started after every dependency finished.
        let histories = feed.histories
        problems = []
        var crossInstance = 0
        var crossQueue = 0
        let home = Dictionary(ledger.acks.map { ($0.id, ($0.node, $0.queue)) }) { a, _ in a }
        for ack in ledger.acks {
            guard let start = histories[ack.id]?.starts.first else { continue }
            for dep in ack.dependencies {
                if home[dep]?.0 != home[ack.id]?.0 { crossInstance += 1 }
                if home[dep]?.1 != ack.queue { crossQueue += 1 }
                guard let done = histories[dep]?.finishes.first else {
                    problems.append("\(ack.id) depends on \(dep), which never finished in the feed")
                    continue
                }
                if start < done { problems.append("\(ack.id) (\(ack.queue)) started at seq \(start), before its dependency \(dep) finished at seq \(done)") }
            }
        }
        cluster.record(problems, "dependency order")
        // Which instance owns each queue (as node 0 reads the cluster), and the dependencies
        // between operations of queues of different owners (through the feed, not memory).
        var ownerOf: [String: String] = [:]
        for i in nodes[0].clusterView()?.answer["instances"] as? [[String: Any]] ?? [] {
            for q in i["queues"] as? [String] ?? [] { ownerOf[q] = i["id"] as? String }
        }
        var crossOwner = 0
        for ack in ledger.acks {
            for dep in ack.dependencies where ownerOf[home[dep]?.1 ?? ""] != ownerOf[ack.queue] { crossOwner += 1 }
        }
        // Every instance lists every queue (from PostgreSQL), the same bytes.
        problems = []
        var lists: [String] = []
        for n in nodes {
            guard let r = try? n.request("GET", "/v1/queues"), r.status == 200 else {
                problems.append("opqd #\(n.index): GET /v1/queues did not answer 200")
                continue
            }
            let names = r.objects("queues").compactMap { $0["name"] as? String }.sorted()
            if names != queues.map(\.name).sorted() { problems.append("opqd #\(n.index) lists the queues \(names)") }
            lists.append(r.text)
        }
        if Set(lists).count > 1 { problems.append("the instances' GET /v1/queues answers differ") }
        cluster.record(problems, "the queue listing on every instance")
        if crossInstance == 0 || crossQueue == 0 {
            cluster.record(["the dependencies should cross instances (\(crossInstance)) and queues (\(crossQueue))"], "the workload")
        }
        // Replaying the feed per queue: never more executing than the limit.
        let peaks = feed.peakExecuting
        cluster.record(
            queues.filter { (peaks[$0.name] ?? 0) > $0.limit }.map {
                "queue \($0.name) (maxConcurrentOperationCount \($0.limit)) had \(peaks[$0.name]!) operations executing at once in the feed"
            }, "the limits")
        if ledger.acks.count != clients * perClient { cluster.record(["\(ledger.summary)"], "creates") }
        let peak = queues.map { "\($0.name) \(peaks[$0.name] ?? 0)/\($0.limit)" }.joined(separator: ", ")
        print(
            "ClusterTests.exactlyOnce: \(ledger.acks.count) operations in \(queues.count) queues through \(nodes.count) instances: "
                + String(format: "created in %.2f s, all finished %.2f s later; ", created - t0, finished - created)
                + "\(feed.events.count) events (\(feeds.count) feeds read); peak executing \(peak); "
                + "\(crossInstance) dependencies across instances (as created), \(crossOwner) across owners, \(crossQueue) across queues; "
                + "owners \(Set(ownerOf.values).count) for \(ownerOf.count) queues; \(ledger.summary)")
        try cascadeAcrossOwners(cluster)
        try copyAndFinishAcrossOwners(cluster)
    }

    /// Two queue names whose partitions different instances hold, and an instance holding
    /// neither (nil when 40 names do not give two holders).
    static func queuesOfTwoOwners(_ cluster: TestCluster, prefix: String) -> (String, String, ClusterNode)? {
        var byHolder: [Int: String] = [:]
        for i in 0..<40 where byHolder.count < 2 {
            let name = "\(prefix)-\(i)"
            if let h = cluster.awaitHolder(of: name), byHolder[h.index] == nil { byHolder[h.index] = name }
        }
        let pair = byHolder.sorted { $0.key < $1.key }
        guard pair.count == 2 else { return nil }
        let third = cluster.nodes.first { $0.index != pair[0].key && $0.index != pair[1].key } ?? cluster.nodes[0]
        return (pair[0].value, pair[1].value, third)
    }

    /// Through an instance that holds neither queue: a copy into the other owner's queue, and
    /// one finish request for external operations of both owners' queues, split between them.
    static func copyAndFinishAcrossOwners(_ cluster: TestCluster) throws {
        guard let (qa, qb, third) = queuesOfTwoOwners(cluster, prefix: "split") else {
            cluster.record(["no two queue names with different holders among 40"], "copy and finish across owners")
            return
        }
        let nodes = cluster.nodes
        try cluster.createQueue(qa, maxConcurrent: 5, via: nodes[0])
        try cluster.createQueue(qb, maxConcurrent: 5, via: nodes[1])
        var problems: [String] = []
        func create(_ queue: String) throws -> String {
            let r = try third.request(
                "POST", "/v1/queues/\(queue)/operations", json: #"{"kind":"external","name":"w","spec":{"lease":30},"queuePriority":"high"}"#)
            guard r.status == 201, let id = r.string("id") else { throw Unexpected("creating an external operation in \(queue)", r) }
            return id
        }
        let a = try create(qa)
        _ = try create(qb)
        // The copy of a goes to qb, whose owner reads a's row.
        let copy = try third.request("POST", "/v1/operations/\(a)/copy", json: #"{"queue":"\#(qb)"}"#)
        if copy.status != 201 || copy.string("queue") != qb || copy.string("kind") != "external" || copy.string("queuePriority") != "high" {
            problems.append("copy of \(a) into \(qb) through opqd #\(third.index): \(copy.status) \(copy.text.prefix(300))")
        }
        // A worker claims one operation in each queue, and finishes both in one request.
        func claim(_ queue: String) throws -> (id: String, token: String)? {
            let r = try third.request("POST", "/v1/queues/\(queue)/claim?wait=5", json: #"{"worker":"split-worker"}"#)
            guard r.status == 200, let op = r.object["operation"] as? [String: Any], let id = op["id"] as? String,
                let lease = r.object["lease"] as? [String: Any], let token = lease["token"] as? String
            else {
                problems.append("claim in \(queue): \(r.status) \(r.text.prefix(200))")
                return nil
            }
            return (id, token)
        }
        guard let ca = try claim(qa), let cb = try claim(qb) else {
            cluster.record(problems, "copy and finish across owners")
            return
        }
        // A malformed element refuses the whole request: nothing finishes anywhere.
        let bad = try third.request(
            "POST", "/v1/operations:finish",
            json: #"{"finishes":[{"id":"\#(ca.id)","leaseToken":"\#(ca.token)"},{"id":"\#(cb.id)","leaseToken":"\#(cb.token)","extra":1}]}"#)
        if bad.status != 422 || !(bad.string("detail") ?? "").hasPrefix("finishes[1]") {
            problems.append("a finish with a malformed second element answered \(bad.status): \(bad.text.prefix(300))")
        }
        let unknown = "op-00000000000fffff"
        let r = try third.request(
            "POST", "/v1/operations:finish",
            json: #"{"finishes":[{"id":"\#(cb.id)","leaseToken":"\#(cb.token)","result":{"n":2}},{"id":"\#(unknown)","leaseToken":"x"},"#
                + #"{"id":"\#(ca.id)","leaseToken":"\#(ca.token)","result":{"n":1}},{"id":"\#(ca.id)","leaseToken":"\#(ca.token)"}]}"#)
        let entries = r.objects("finishes")
        let statuses = entries.map { ($0["status"] as? NSNumber)?.intValue ?? -1 }
        let ids = entries.map { $0["id"] as? String ?? "" }
        if r.status != 200 || statuses != [200, 404, 200, 409] || ids != [cb.id, unknown, ca.id, ca.id] {
            problems.append("the split finish answered \(r.status), statuses \(statuses), ids \(ids): \(r.text.prefix(600))")
        } else {
            let detail = (entries[1]["problem"] as? [String: Any])?["detail"] as? String ?? ""
            if !detail.hasPrefix("finishes[1]") { problems.append("the unknown id's problem names \(detail.prefix(40)), not finishes[1]") }
            let again = (entries[3]["problem"] as? [String: Any])?["detail"] as? String ?? ""
            if !again.hasPrefix("finishes[3]") { problems.append("the repeated finish's problem names \(again.prefix(40)), not finishes[3]") }
        }
        for (id, n) in [(ca.id, 1), (cb.id, 2)] {
            let s = try nodes[2].request("GET", "/v1/operations/\(id)")
            let result = s.object["result"] as? [String: Any]
            if s.string("outcome") != "succeeded" || (result?["n"] as? NSNumber)?.intValue != n {
                problems.append("\(id) after the split finish: \(s.text.prefix(300))")
            }
        }
        cluster.record(problems, "copy and finish across owners")
        print("ClusterTests.split: a copy from \(qa) into \(qb), and one finish request over both owners' queues, through opqd #\(third.index): \(statuses)")
    }

    /// `cancel?cascade=true` through a third instance: the dependents in the queue of another
    /// owner are cancelled without starting, and the cascade comes back to the first owner's queue.
    static func cascadeAcrossOwners(_ cluster: TestCluster) throws {
        let nodes = cluster.nodes
        guard let (qa, qb, third) = queuesOfTwoOwners(cluster, prefix: "cascade") else {
            cluster.record(["no two queue names with different holders among 40"], "cascade across owners")
            return
        }
        try cluster.createQueue(qa, maxConcurrent: 2, via: nodes[0])
        try cluster.createQueue(qb, maxConcurrent: 2, via: nodes[1])
        func create(_ queue: String, _ extra: String, via node: ClusterNode) throws -> String {
            let r = try node.request("POST", "/v1/queues/\(queue)/operations", json: #"{"kind":"delay","spec":{"seconds":0.01}\#(extra)}"#)
            guard r.status == 201, let id = r.string("id") else { throw Unexpected("creating an operation in \(queue)", r) }
            return id
        }
        let x = try create(qa, #","notBefore":"2100-01-01T00:00:00Z""#, via: nodes[1])
        let y = try create(qb, #","dependencies":["\#(x)"]"#, via: nodes[2])
        let z = try create(qa, #","dependencies":["\#(y)"]"#, via: nodes[0])
        let t0 = monotonicSeconds()
        let cancel = try third.request("POST", "/v1/operations/\(x)/cancel?cascade=true")
        guard cancel.status == 200 else { throw Unexpected("cancel?cascade=true of \(x)", cancel) }
        var problems: [String] = []
        let reached = waitUntil(timeout: 10, every: 0.02) { (try? nodes[2].request("GET", "/v1/operations/\(z)"))?.string("state") == "finished" }
        let took = monotonicSeconds() - t0
        if !reached { problems.append("\(z) (in \(qa), after \(y) in \(qb)) was not finished 10 s after the cascade") }
        for id in [y, z] {
            guard let r = try? nodes[0].request("GET", "/v1/operations/\(id)"), r.status == 200 else {
                problems.append("GET \(id) failed")
                continue
            }
            if r.string("outcome") != "cancelled" || r.object["startedAt"] != nil {
                problems.append(
                    "\(id): outcome \(r.string("outcome") ?? "none"), startedAt \(r.string("startedAt") ?? "none"): expected cancelled, never started")
            }
        }
        cluster.record(problems, "cascade across owners")
        print(String(format: "ClusterTests.cascade: %@ -> %@ -> %@ cancelled across two owners in %.3f s", x, y, z, took))
    }
}
