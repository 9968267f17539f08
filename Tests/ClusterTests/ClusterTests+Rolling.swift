import Foundation
import Locking
import PostgresStore
import TestKit
import Testing

#if canImport(Glibc)
import Glibc
#endif

extension ClusterTests {
    /// API.md "Many instances": membership changes do not show to clients. Four clients create
    /// operations without pause through the instances that are up, as a load balancer sends
    /// (an instance leaves their list before its SIGTERM and joins it once `/readyz` says 200),
    /// while each instance in turn is stopped and started again on its own `--data` (its
    /// identity), then one is stopped for good (a scale-down) and a new one joins (a scale-up).
    @Test("a rolling restart, a scale-down and a scale-up under load: no request refused, every acknowledged operation finishes")
    func rollingRestart() async throws {
        try await TestCluster(name: "rolling").run(Self.rollingRestart)
    }

    static func rollingRestart(_ cluster: TestCluster) throws {
        guard waitUntil(timeout: 30, every: 0.05, { cluster.nodes.allSatisfy { $0.isReady(timeout: 2) } }) else {
            cluster.record(["the instances did not answer /readyz 200 within 30 s"], "readyz")
            return
        }
        let queues = (0..<24).map { "roll-\($0)" }
        for (i, q) in queues.enumerated() { try cluster.createQueue(q, maxConcurrent: 4, via: cluster.nodes[i % 3]) }
        let up = Lock(cluster.nodes)
        let stop = Lock(false)
        let made = Lock<(ids: [String], refused: [String], slowest: Double, count: Int)>(([], [], 0, 0))
        let group = DispatchGroup()
        // `count` clients, client c calling `send(c, n, node)` for its n-th request, through the
        // instances that are up in turn, until `stop`.
        func clients(_ count: Int, _ send: @escaping @Sendable (_ c: Int, _ n: Int, _ node: ClusterNode) -> Void) {
            for c in 0..<count {
                group.enter()
                let thread = Thread {
                    defer { group.leave() }
                    var n = 0
                    while !stop.value {
                        let nodes = up.value
                        send(c, n, nodes[(n + c) % nodes.count])
                        n += 1
                    }
                }
                thread.stackSize = 1 << 20
                thread.start()
            }
        }
        clients(4) { c, n, node in
            let queue = queues[(n * 4 + c) % queues.count]
            let t = monotonicSeconds()
            let outcome = node.exchange("POST", "/v1/queues/\(queue)/operations", json: #"{"kind":"delay","spec":{"seconds":0.05}}"#)
            let d = monotonicSeconds() - t
            made.withLock { m in
                m.count += 1
                m.slowest = max(m.slowest, d)
                if let r = outcome.response, r.status == 201, let id = r.string("id") {
                    m.ids.append(id)
                } else {
                    let what = outcome.response.map { "\($0.status) \(String(decoding: $0.body.prefix(200), as: UTF8.self))" } ?? "\(outcome)"
                    m.refused.append("create in \(queue) through opqd #\(node.index) (pid \(node.pid)): \(what)")
                }
            }
        }
        // Long polls through it all, as workers and watchers make them: a wait on an operation,
        // a wait on a queue, a claim on a queue with nothing to claim. Each, wherever it waits
        // when its queue moves or its instance stops, is answered as at its timeout or sooner
        // (200, 204), never refused.
        try cluster.createQueue("roll-claims", maxConcurrent: 4, via: cluster.nodes[0])
        let polls = Lock<(count: Int, refused: [String])>((0, []))
        clients(3) { c, n, node in
            let recent = made.withLock { m in m.ids.suffix(50).randomElement() }
            let (method, path): (String, String)
            switch (n + c) % 3 {
            case 0 where recent != nil: (method, path) = ("GET", "/v1/operations/\(recent ?? "")/wait?timeout=3")
            case 1: (method, path) = ("POST", "/v1/queues/roll-claims/claim?wait=3")
            default: (method, path) = ("GET", "/v1/queues/\(queues[(n * 3 + c) % queues.count])/wait?timeout=3")
            }
            let outcome = node.exchange(method, path, timeout: 15)
            polls.withLock { p in
                p.count += 1
                guard let r = outcome.response, r.status == 200 || r.status == 204 else {
                    let what = outcome.response.map { "\($0.status) \(String(decoding: $0.body.prefix(200), as: UTF8.self))" } ?? "\(outcome)"
                    p.refused.append("\(method) \(path) through opqd #\(node.index) (pid \(node.pid)): \(what)")
                    return
                }
            }
        }
        // Workers: each makes external operations through one instance, claims them through
        // another and finishes what it got in one POST /v1/operations:finish through a third
        // (sent on to the queue's holder, whichever it is by then).
        try cluster.createQueue("roll-work", maxConcurrent: 8, via: cluster.nodes[1])
        let work = Lock<(finished: Int, conflicts: Int, refused: [String])>((0, 0, []))
        clients(2) { c, n, node in
            let nodes = up.value
            func refused(_ what: String, _ outcome: HTTPOutcome) {
                let text = outcome.response.map { "\($0.status) \(String(decoding: $0.body.prefix(300), as: UTF8.self))" } ?? "\(outcome)"
                work.withLock { $0.refused.append("\(what): \(text)") }
            }
            for _ in 0..<2 {
                let made = node.exchange("POST", "/v1/queues/roll-work/operations", json: #"{"kind":"external","spec":{"lease":30}}"#)
                if made.response?.status != 201 { refused("create external through opqd #\(node.index)", made) }
            }
            let claimer = nodes[(n + c + 1) % nodes.count]
            let claim = claimer.exchange("POST", "/v1/queues/roll-work/claim?wait=1&max=2", timeout: 15)
            guard let r = claim.response, r.status == 200 || r.status == 204 else { return refused("claim through opqd #\(claimer.index)", claim) }
            let finishes = r.objects("claims").compactMap { c -> String? in
                guard let id = (c["operation"] as? [String: Any])?["id"] as? String, let token = (c["lease"] as? [String: Any])?["token"] as? String else {
                    return nil
                }
                return #"{"id":"\#(id)","leaseToken":"\#(token)","result":{"n":1}}"#
            }
            guard r.status == 200 else { return }
            if finishes.count != r.objects("claims").count { return refused("claim with an operation or lease missing", claim) }
            let finisher = nodes[(n + c + 2) % nodes.count]
            let done = finisher.exchange("POST", "/v1/operations:finish", json: #"{"finishes":[\#(finishes.joined(separator: ","))]}"#, timeout: 15)
            guard let d = done.response, d.status == 200 else { return refused("finish through opqd #\(finisher.index)", done) }
            let entries = d.objects("finishes")
            let ok = entries.filter { ($0["status"] as? Int) == 200 }.count
            // A finish refused 409 lease-conflict is counted apart: one in 3,044 was seen in a
            // clean-clone run, a finish held for a handover served by the new holder before its
            // kind had taken the saved lease up (fixed; ClaimAnswerTests.leaseTakenUpBeforeCommit).
            let conflicts = entries.filter {
                ($0["status"] as? Int) == 409 && (($0["problem"] as? [String: Any])?["type"] as? String)?.hasSuffix("/lease-conflict") == true
            }
            work.withLock {
                $0.finished += ok
                $0.conflicts += conflicts.count
            }
            if ok + conflicts.count != finishes.count || entries.count != finishes.count {
                refused("finish of \(finishes.count) through opqd #\(finisher.index)", done)
            }
        }
        var started: [ClusterNode] = []
        defer { for node in started { node.stop() } }
        var problems: [String] = []
        func leave(_ index: Int) {
            let node = up.withLock { u -> ClusterNode? in
                guard let k = u.firstIndex(where: { $0.index == index }) else { return nil }
                return u.remove(at: k)
            }
            guard let node else { return }
            let t = monotonicSeconds()
            node.stop(grace: 20)
            let exit = node.waitForExit(timeout: 0)
            print(
                String(
                    format: "ClusterTests.rollingRestart: opqd #%d stopped in %.2f s (%@)", index, monotonicSeconds() - t,
                    "\(exit.map { "\($0)" } ?? "running")"))
        }
        func join(_ index: Int, data: String) throws {
            let node = try ClusterNode(
                index: index, binary: try OpqdBinary.locate(), arguments: ["--store", cluster.database, "--lease", String(Int(TestCluster.lease))],
                data: cluster.logs + "/" + data, logPath: cluster.logs + "/opqd-\(index).log")
            started.append(node)
            if waitUntil(timeout: 30, every: 0.02, { node.isReady() }) {
                up.withLock { $0.append(node) }
            } else {
                problems.append("opqd #\(index) (restarted on \(data)) did not answer /readyz 200 within 30 s")
            }
        }
        usleep(1_000_000)
        for i in 0..<3 {
            leave(i)
            try join(i, data: "data-\(i)")
            usleep(1_500_000)
        }
        // Scale-down, then scale-up with a new instance.
        leave(2)
        usleep(2_000_000)
        try join(3, data: "data-3")
        usleep(2_000_000)
        stop.withLock { $0 = true }
        group.wait()

        let m = made.value
        print(String(format: "ClusterTests.rollingRestart: %d creates, %d refused, slowest %.3f s", m.count, m.refused.count, m.slowest))
        let p = polls.value
        print("ClusterTests.rollingRestart: \(p.count) long polls, \(p.refused.count) refused")
        let w = work.value
        print(
            "ClusterTests.rollingRestart: \(w.finished) external operations claimed and finished, \(w.conflicts) finishes refused 409 lease-conflict, \(w.refused.count) refused"
        )
        problems += w.refused.prefix(10)
        if w.conflicts > 0 { problems.append("\(w.conflicts) finishes of claimed operations were refused 409 lease-conflict") }
        if w.finished < 20 { problems.append("only \(w.finished) external operations were claimed and finished: too little to tell") }
        problems += p.refused.prefix(10)
        if p.refused.count > 10 { problems.append("… and \(p.refused.count - 10) more long polls refused") }
        problems += m.refused.prefix(10)
        if m.refused.count > 10 { problems.append("… and \(m.refused.count - 10) more refused") }
        // Held at most a few seconds (API.md: bounded) while a queue moves.
        if m.slowest > 6 { problems.append(String(format: "the slowest create took %.2f s (a request is held 5 s at most)", m.slowest)) }
        if m.ids.count < 200 { problems.append("only \(m.ids.count) creates were acknowledged: too little load to tell") }

        // Every acknowledged operation exists and finishes.
        let nodes = up.value
        for q in queues where !cluster.awaitIdle(q, through: nodes, timeout: 30) { problems.append("queue \(q) did not become idle within 30 s") }
        var unfinished: [String] = []
        for (i, id) in m.ids.enumerated() {
            let node = nodes[i % nodes.count]
            guard let r = try? node.request("GET", "/v1/operations/\(id)") else {
                unfinished.append("\(id): no answer")
                continue
            }
            if r.status != 200 || r.string("state") != "finished" || r.string("outcome") != "succeeded" {
                unfinished.append("\(id): \(r.status) \(r.string("state") ?? "?") \(r.string("outcome") ?? "?")")
            }
        }
        if !unfinished.isEmpty { problems.append("\(unfinished.count) of \(m.ids.count) acknowledged operations did not succeed: \(unfinished.prefix(5))") }
        // Each queue's history followed it through every hand-over: its counts add up to what
        // was done (API.md "History"). Read through any instance (each queue's owner answers).
        var created = 0
        var succeeded = 0
        for (i, q) in queues.enumerated() {
            guard let r = try? nodes[i % nodes.count].request("GET", "/v1/queues/\(q)/history?step=3600"), r.status == 200 else {
                problems.append("no history for \(q)")
                continue
            }
            for b in r.objects("buckets") {
                created += (b["created"] as? Int) ?? 0
                succeeded += (b["succeeded"] as? Int) ?? 0
            }
        }
        if m.refused.isEmpty && (created != m.ids.count || succeeded != m.ids.count) {
            problems.append("the queues' history counts \(created) created and \(succeeded) succeeded; \(m.ids.count) were acknowledged and succeeded")
        }
        cluster.record(problems, "rolling restart, scale-down and scale-up under load")
    }
}

extension ClusterTests {
    /// An instance that crashed and is started again with the same identity (its `--data`)
    /// takes its partitions back at once, not after its lease of 30 s; a second process on the
    /// same `--data` meanwhile takes a fresh identity.
    @Test("an instance killed and started again on its --data takes its partitions back at once, not after its lease")
    func restartKeepsIdentity() async throws {
        try await TestCluster(size: 2, name: "identity").run(Self.restartKeepsIdentity)
    }

    static func restartKeepsIdentity(_ cluster: TestCluster) throws {
        let arguments = ["--store", cluster.database, "--lease", "30"]
        let data = cluster.logs + "/data-long"
        func start(_ index: Int, _ data: String) throws -> ClusterNode {
            try ClusterNode(
                index: index, binary: try OpqdBinary.locate(), arguments: arguments, data: data, logPath: cluster.logs + "/opqd-\(index).log")
        }
        func selfID(_ node: ClusterNode) -> String? {
            (node.clusterView()?.answer["instances"] as? [[String: Any]])?.first { $0["self"] as? Bool == true }?["id"] as? String
        }
        var problems: [String] = []
        let first = try start(2, data)
        defer { first.killNow() }
        guard waitUntil(timeout: 30, every: 0.05, { first.isReady() }),
            cluster.awaitSpread(among: cluster.nodes + [first], timeout: 30),
            let id = selfID(first)
        else {
            cluster.record(["the third instance (lease 30 s) did not take its share within 30 s"], "start")
            return
        }
        // A second process on the same --data is another instance.
        let twin = try start(3, data)
        if !waitUntil(timeout: 10, every: 0.05, { selfID(twin) != nil }) {
            problems.append("a second process on the same --data did not answer GET /v1/cluster within 10 s")
        } else if selfID(twin) == id {
            problems.append("a second process on the same --data took the same identity \(id)")
        }
        twin.stop()

        // One of its queues, with an operation in it.
        let held = ((first.clusterView()?.answer["instances"] as? [[String: Any]])?.first { $0["self"] as? Bool == true }?["partitions"] as? [Int]) ?? []
        guard let queue = (0..<1000).map({ "ident-\($0)" }).first(where: { held.contains(QueuePartitions.of(queue: $0)) }) else {
            cluster.record(["the third instance holds no partition"], "placement")
            return
        }
        try cluster.createQueue(queue, maxConcurrent: 1, via: first)
        first.killNow()
        let t = monotonicSeconds()
        let again = try start(2, data)
        defer { again.stop() }
        let back = waitUntil(timeout: 20, every: 0.02) {
            (try? again.request("POST", "/v1/queues/\(queue)/operations", json: #"{"kind":"delay","spec":{"seconds":0}}"#, timeout: 2))?.status == 201
        }
        let took = monotonicSeconds() - t
        print(String(format: "ClusterTests.restartKeepsIdentity: a create in its queue succeeded %.2f s after the restart (lease 30 s)", took))
        if !back || took > 10 { problems.append(String(format: "the restarted instance served its queue only after %.1f s (lease 30 s)", took)) }
        if let again = selfID(again), again != id { problems.append("the restarted instance took identity \(again), not \(id)") }
        if cluster.awaitHolder(of: queue, among: cluster.nodes + [again], timeout: 5) !== again {
            problems.append("the restarted instance does not hold \(queue)")
        }
        cluster.record(problems, "a restart with the same identity")
    }
}

extension ClusterTests {
    /// Leases live in the engine of their queue's holder; `GET /v1/workers` through any
    /// instance lists the workers of every instance's queues.
    @Test("GET /v1/workers through any instance lists the leases held on every instance")
    func workersAcrossInstances() async throws {
        try await TestCluster(name: "workers").run(Self.workersAcrossInstances)
    }

    static func workersAcrossInstances(_ cluster: TestCluster) throws {
        guard cluster.awaitSpread() else {
            cluster.record(["the instances did not agree within 20 s on a spread of the partitions"], "start")
            return
        }
        // One queue held by each instance.
        var byHolder: [Int: String] = [:]
        for i in 0..<200 where byHolder.count < 3 {
            let name = "wk-\(i)"
            let holderIndex = cluster.nodes.firstIndex { node in
                let held = ((node.clusterView()?.answer["instances"] as? [[String: Any]])?.first { $0["self"] as? Bool == true }?["partitions"] as? [Int]) ?? []
                return held.contains(QueuePartitions.of(queue: name))
            }
            if let h = holderIndex, byHolder[h] == nil { byHolder[h] = name }
        }
        guard byHolder.count == 3 else {
            cluster.record(["no queue name found for each of the three instances"], "placement")
            return
        }
        var problems: [String] = []
        var expected: [String: String] = [:]  // operation id -> worker
        for (h, queue) in byHolder.sorted(by: { $0.key < $1.key }) {
            try cluster.createQueue(queue, maxConcurrent: 4, via: cluster.nodes[0])
            let made = try cluster.nodes[1].request("POST", "/v1/queues/\(queue)/operations", json: #"{"kind":"external","spec":{"lease":60}}"#)
            guard made.status == 201, let id = made.string("id") else {
                problems.append("create in \(queue): \(made.status)")
                continue
            }
            // Claimed through an instance that does not hold the queue.
            let via = cluster.nodes[(h + 1) % 3]
            let claim = try via.request("POST", "/v1/queues/\(queue)/claim?wait=5", json: #"{"worker":"worker-\#(h)"}"#)
            if claim.status != 200 { problems.append("claim in \(queue) through opqd #\(via.index): \(claim.status)") }
            expected[id] = "worker-\(h)"
        }
        for node in cluster.nodes {
            let r = try node.request("GET", "/v1/workers")
            var seen: [String: String] = [:]
            for w in r.objects("workers") {
                guard let name = w["worker"] as? String else { continue }
                for l in w["leases"] as? [[String: Any]] ?? [] { if let op = l["operation"] as? String { seen[op] = name } }
            }
            if r.status != 200 || seen != expected {
                problems.append("GET /v1/workers through opqd #\(node.index): \(r.status), leases \(seen), expected \(expected)")
            }
        }
        cluster.record(problems, "GET /v1/workers across instances")
    }
}
