import Foundation
import PostgresStore
import TestKit
import Testing

extension ClusterTests {
    @Test("a batch over queues of different owners is committed whole, in order, with dependencies across them; a refused one changes nothing anywhere")
    func batchAcrossOwners() async throws {
        try await TestCluster(name: "batch").run(Self.batchAcrossOwners)
    }

    static func batchAcrossOwners(_ cluster: TestCluster) throws {
        guard cluster.awaitSpread() else {
            cluster.record(["the instances did not agree within 20 s on a spread of the partitions over all three"], "start")
            return
        }
        guard let (qa, qb, third) = queuesOfTwoOwners(cluster, prefix: "batch") else {
            cluster.record(["no two queue names with different holders among 40"], "batch across owners")
            return
        }
        let nodes = cluster.nodes
        try cluster.createQueue(qa, maxConcurrent: 4, via: nodes[0])
        try cluster.createQueue(qb, maxConcurrent: 4, via: nodes[1])
        var problems: [String] = []
        let first = try third.request("POST", "/v1/queues/\(qb)/operations", json: #"{"kind":"delay","spec":{"seconds":0.05}}"#)
        guard first.status == 201, let existing = first.string("id") else { throw Unexpected("creating an operation in \(qb)", first) }

        // a (qa) <- b (qb) <- c (qa, and the existing operation in qb): edges both ways across owners.
        let body = #"""
            {"operations":[
              {"ref":"a","queue":"\#(qa)","kind":"delay","name":"a","spec":{"seconds":0.2}},
              {"ref":"b","queue":"\#(qb)","kind":"delay","name":"b","spec":{"seconds":0.05},"dependencies":["ref:a"]},
              {"queue":"\#(qa)","kind":"delay","name":"c","spec":{"seconds":0.01},"dependencies":["ref:b","\#(existing)"]}]}
            """#
        let t0 = monotonicSeconds()
        let made = try third.request("POST", "/v1/operations:batch", json: body)
        let took = monotonicSeconds() - t0
        let ops = made.objects("operations")
        let queues = ops.map { $0["queue"] as? String ?? "" }
        let names = ops.map { $0["name"] as? String ?? "" }
        let ids = ops.map { $0["id"] as? String ?? "" }
        if made.status != 201 || queues != [qa, qb, qa] || names != ["a", "b", "c"] || Set(ids).count != 3 || ids.contains("") {
            problems.append("the batch through opqd #\(third.index) answered \(made.status): \(made.text.prefix(800))")
        } else {
            if (ops[1]["dependencies"] as? [String]) != [ids[0]] { problems.append("b's dependencies: \(ops[1]["dependencies"] ?? "none"), not [\(ids[0])]") }
            if let deps = ops[2]["dependencies"] as? [String], Set(deps) != Set([ids[1], existing]) {
                problems.append("c's dependencies: \(deps), not \(ids[1]) and \(existing)")
            }
            if ops[1]["state"] as? String != "pending" { problems.append("b was \(ops[1]["state"] ?? "?") when created, not pending") }
            // Every instance shows each one, and each ends after what it waits for.
            guard cluster.awaitIdle(qa, through: nodes, timeout: 20), cluster.awaitIdle(qb, through: nodes, timeout: 20) else {
                cluster.record(problems + ["the batch's queues did not become idle in 20 s"], "batch across owners")
                return
            }
            var times: [String: (started: String, finished: String)] = [:]
            for (id, node) in zip(ids + [existing], nodes + [nodes[0]]) {
                let s = try node.request("GET", "/v1/operations/\(id)")
                if s.string("outcome") != "succeeded" { problems.append("\(id) through opqd #\(node.index): \(s.text.prefix(300))") }
                times[id] = (s.string("startedAt") ?? "", s.string("finishedAt") ?? "")
            }
            // RFC 3339 UTC times of one length compare as text.
            if let a = times[ids[0]], let b = times[ids[1]], !(a.finished <= b.started) {
                problems.append("b started at \(b.started), before a finished at \(a.finished)")
            }
            if let b = times[ids[1]], let c = times[ids[2]], !(b.finished <= c.started) {
                problems.append("c started at \(c.started), before b finished at \(b.finished)")
            }
        }

        // Refused by an owner (a queue that does not exist, held by qb's owner) or by any
        // instance (a bad spec): nothing anywhere, no event.
        let missing =
            (0..<40).map { "batch-missing-\($0)" }.first { cluster.awaitHolder(of: $0)?.index == cluster.awaitHolder(of: qb)?.index } ?? "batch-missing"
        let countsBefore = try counts(qa, qb, via: nodes[0])
        let seqBefore = try newestSeq(via: nodes[0])
        let refusals: [(String, Int, String)] = [
            (
                #"{"operations":[{"queue":"\#(qa)","kind":"delay","spec":{"seconds":0}},{"queue":"\#(missing)","kind":"delay","spec":{"seconds":0}}]}"#,
                404, "operations[1].queue"
            ),
            (
                #"{"operations":[{"queue":"\#(qa)","kind":"delay","spec":{"seconds":0}},{"queue":"\#(qb)","kind":"delay","spec":{"seconds":-1}}]}"#,
                422, "operations[1].spec"
            ),
            (
                #"{"operations":[{"queue":"\#(qb)","kind":"delay","spec":{"seconds":0}},{"queue":"\#(qa)","kind":"delay","spec":{"seconds":0},"dependencies":["op-00000000000fffff"]}]}"#,
                404, "operations[1].dependencies"
            ),
        ]
        for (body, status, names) in refusals {
            for node in [third, nodes[0]] {
                let r = try node.request("POST", "/v1/operations:batch", json: body)
                if r.status != status || !(r.string("detail") ?? "").hasPrefix(names) {
                    problems.append(
                        "a refused batch through opqd #\(node.index) answered \(r.status) (wanted \(status) naming \(names)): \(r.text.prefix(300))")
                }
            }
        }
        let countsAfter = try counts(qa, qb, via: nodes[1])
        let seqAfter = try newestSeq(via: nodes[2])
        if countsAfter != countsBefore { problems.append("refused batches changed the queues' operation counts: \(countsBefore) -> \(countsAfter)") }
        if seqAfter != seqBefore { problems.append("refused batches left events: the newest seq went \(seqBefore) -> \(seqAfter)") }

        // With an Idempotency-Key, a repeat through another instance answers the first batch.
        let keyed = #"{"operations":[{"queue":"\#(qa)","kind":"delay","spec":{"seconds":0}},{"queue":"\#(qb)","kind":"delay","spec":{"seconds":0}}]}"#
        let once = try third.request("POST", "/v1/operations:batch", json: keyed, headers: ["Idempotency-Key": "batch-key-1"])
        let again = try nodes[0].request("POST", "/v1/operations:batch", json: keyed, headers: ["Idempotency-Key": "batch-key-1"])
        let onceIDs = once.objects("operations").map { $0["id"] as? String ?? "" }
        let againIDs = again.objects("operations").map { $0["id"] as? String ?? "" }
        if once.status != 201 || again.status != 201 || onceIDs != againIDs || onceIDs.count != 2 || again.headers["idempotent-replayed"] != "true" {
            problems.append(
                "a keyed batch and its repeat answered \(once.status) \(onceIDs) and \(again.status) \(againIDs) replayed \(again.headers["idempotent-replayed"] ?? "no")"
            )
        }
        let other = try nodes[1].request(
            "POST", "/v1/operations:batch", json: keyed.replacingOccurrences(of: "\"seconds\":0}", with: "\"seconds\":1}"),
            headers: ["Idempotency-Key": "batch-key-1"])
        if other.status != 422 { problems.append("the same key with another body answered \(other.status): \(other.text.prefix(200))") }
        problems += try partNobodyDecides(cluster)
        problems += try partAddedByTheNextHolder(cluster)
        cluster.record(problems, "batch across owners")
        print(
            "ClusterTests.batch: 3 elements over \(qa) and \(qb) through opqd #\(third.index) in \(String(format: "%.3f", took)) s; 6 refusals changed nothing")
    }

    /// A part prepared at its owner (as a deciding instance asks) whose outcome nobody tells
    /// it: its queue cannot be deleted while the part is held, then the owner writes the batch
    /// off (`BatchAcross.decisionWait`, 10 s) and lets the part go.
    static func partNobodyDecides(_ cluster: TestCluster) throws -> [String] {
        guard let holder = try cluster.spreadQueue("batch-held") else { return ["no holder for batch-held"] }
        var problems: [String] = []
        let id = "0123456789abcdef0123456789abcdef"
        let prepared = try holder.request(
            "POST", "/v1/operations:batch", json: #"{"operations":[{"queue":"batch-held","kind":"delay","spec":{"seconds":0}}]}"#,
            headers: ["opqd-batch": "prepare \(id)", "opqd-forwarded-by": "a-test"])
        if prepared.status != 200 || (prepared.object["ids"] as? [String])?.count != 1 {
            return ["a prepare asked of the holder answered \(prepared.status): \(prepared.text.prefix(300))"]
        }
        let t0 = monotonicSeconds()
        let held = try holder.request("DELETE", "/v1/queues/batch-held")
        if held.status != 409 { problems.append("deleting a queue with a prepared part answered \(held.status), not 409") }
        var deleted = false
        while !deleted && monotonicSeconds() - t0 < 20 {
            usleep(250_000)
            deleted = try holder.request("DELETE", "/v1/queues/batch-held").status == 204
        }
        let waited = monotonicSeconds() - t0
        let outcome = (try? TestPostgres.psql(cluster.database, "SELECT outcome FROM opqd.batches WHERE id = '\(id)'")) ?? ""
        if !deleted || waited < 9 {
            problems.append(String(format: "the held queue was deletable after %.1f s (deleted: \(deleted)); the part is held 10 s", waited))
        }
        if outcome.trimmingCharacters(in: .whitespacesAndNewlines) != "abort" { problems.append("the batch nobody decided is '\(outcome)', not 'abort'") }
        print(String(format: "ClusterTests.batch: a prepared part nobody decided was let go after %.1f s", waited))
        return problems
    }

    /// A committed batch whose part was not added yet when its holder left (SIGTERM): the
    /// instance that takes the partition adds it before it serves the queue.
    static func partAddedByTheNextHolder(_ cluster: TestCluster) throws -> [String] {
        guard let holder = try cluster.spreadQueue("batch-moved") else { return ["no holder for batch-moved"] }
        let raw: UInt64 = 1 << 50 | 12345
        let opID = String(format: "op-%016llx", raw)
        let body = #"{"operations":[{"queue":"batch-moved","kind":"delay","name":"left-behind","spec":{"seconds":0}}]}"#
        let part = QueuePartitions.of(queue: "batch-moved")
        let id = "fedcba9876543210fedcba9876543210"
        _ = try TestPostgres.psql(
            cluster.database,
            """
            INSERT INTO opqd.batches (id, outcome, body, ids) VALUES ('\(id)', 'commit', convert_to('\(body)', 'UTF8'), ARRAY[\(raw)]::bigint[]);
            INSERT INTO opqd.batch_parts (batch, part, ids) VALUES ('\(id)', \(part), ARRAY[\(raw)]::bigint[]);
            """)
        let others = cluster.nodes.filter { $0.index != holder.index }
        holder.stop()
        var problems: [String] = []
        let t0 = monotonicSeconds()
        var found: TestResponse?
        while monotonicSeconds() - t0 < 15 {
            let r = try others[0].request("GET", "/v1/operations/\(opID)")
            if r.status == 200 && r.string("outcome") == "succeeded" {
                found = r
                break
            }
            usleep(100_000)
        }
        if found?.string("queue") != "batch-moved" || found?.string("name") != "left-behind" {
            problems.append("the part left behind was not added by the next holder within 15 s: \(found?.text.prefix(300) ?? "not found")")
        }
        usleep(500_000)
        let left = (try? TestPostgres.psql(cluster.database, "SELECT count(*) FROM opqd.batch_parts WHERE batch = '\(id)'")) ?? ""
        if left.trimmingCharacters(in: .whitespacesAndNewlines) != "0" { problems.append("the added part's row is still there (\(left))") }
        print(
            String(
                format: "ClusterTests.batch: a committed part left behind by its holder was added by the next one %.2f s after SIGTERM", monotonicSeconds() - t0
            ))
        return problems
    }

    /// The operation counts of two queues, as one instance shows them.
    static func counts(_ qa: String, _ qb: String, via node: ClusterNode) throws -> [Int] {
        try [qa, qb].map { q in
            let r = try node.request("GET", "/v1/queues/\(q)")
            guard r.status == 200, let n = r.int("operationCount") else { throw Unexpected("GET /v1/queues/\(q)", r) }
            return n
        }
    }

    /// The newest event's seq in the feed (0: none), read page by page.
    static func newestSeq(via node: ClusterNode) throws -> Int {
        var after = 0
        while true {
            let r = try node.request("GET", "/v1/events?after=\(after)&limit=1000")
            guard r.status == 200 else { throw Unexpected("GET /v1/events", r) }
            guard let next = r.int("next"), next > after, !r.objects("events").isEmpty else { return after }
            after = next
        }
    }
}
