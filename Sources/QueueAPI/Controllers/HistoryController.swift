import MicroHTTP
import QueueEngine

/// A queue's history, and the same summed over every queue (API.md "Dashboard", **History**):
/// counts and wait/run percentiles per time bucket, kept by the server (`QueueHistory`).
package struct HistoryController: Sendable {
    let engine: QueueEngine

    package func addRoutes(to r: inout Router) {
        r.add("GET", "/v1/queues/{name}/history", scope: .queue(param: 0)) { req, p in try queue(req, p[0]) }
        r.add("GET", "/v1/history", scope: .everyInstance(merge: { Self.merge($0) })) { req, _ in try all(req) }
    }

    /// `step` (60, 300 or 3600; default 60) and `since` (default 24 hours ago).
    func parameters(_ req: HTTPRequest) throws -> (step: Int64, since: Timestamp) {
        let q = try Query(req, allowed: ["step", "since"])
        var step: Int64 = 60
        if let s = q.values["step"] {
            guard let n = Int64(s), QueueEngine.historySteps.contains(n) else {
                throw Problem.invalid("step", "must be 60, 300 or 3600 (seconds per bucket); got '\(s)'")
            }
            step = n
        }
        let now = SystemClock().now()
        var since = now.adding(seconds: -86_400)
        if let s = q.values["since"] { since = try parseTime(.string(s), field: "since") }
        return (step, since)
    }

    func queue(_ req: HTTPRequest, _ name: String) throws -> HTTPHandlerResult {
        let (step, since) = try parameters(req)
        return answer(req, try engine.history(of: name, step: step, since: since), since: since, scope: name)
    }

    func all(_ req: HTTPRequest) throws -> HTTPHandlerResult {
        let (step, since) = try parameters(req)
        return answer(req, engine.historyOfAll(step: step, since: since), since: since, scope: "")
    }

    private func answer(_ req: HTTPRequest, _ series: HistorySeries, since: Timestamp, scope: String) -> HTTPHandlerResult {
        // What was read (its version), the step, and the window's first bucket: the answer
        // changes with any of them, and not otherwise.
        let from = since.nanoseconds / 1_000_000_000 / series.step
        let etag = ETag.list([("\(scope)|\(series.step)|\(from)", series.version, UInt64(bitPattern: series.buckets.first?.start ?? 0))])
        if ETag.matches(req, etag) { return ETag.notModified(etag) }
        var o = JSONOut(capacity: 64 + 200 * series.buckets.count)
        o.open()
        o.key("step"); o.int(Int(series.step))
        o.key("buckets"); o.openArray()
        for b in series.buckets { Self.write(b, to: &o) }
        o.closeArray()
        o.close()
        return .response(json(200, o.bytes, [("ETag", etag)]))
    }

    static func write(_ b: HistoryBucket, to o: inout JSONOut) {
        o.open()
        o.key("start"); o.time(Timestamp(nanoseconds: b.start &* 1_000_000_000))
        o.key("created"); o.int(b.created)
        o.key("started"); o.int(b.started)
        o.key("succeeded"); o.int(b.succeeded)
        o.key("failed"); o.int(b.failed)
        o.key("cancelled"); o.int(b.cancelled)
        let percentiles: [(StaticString, Double?)] = [
            ("waitP50", b.wait.quantile(0.5)), ("waitP95", b.wait.quantile(0.95)), ("runP50", b.run.quantile(0.5)), ("runP95", b.run.quantile(0.95)),
        ]
        for (key, value) in percentiles {
            o.key(key)
            if let v = value { o.number((v * 1000).rounded() / 1000) } else { o.null() }
        }
        o.close()
    }

    /// `GET /v1/history` over several instances: each answers for the queues it holds. Counts
    /// add up exactly; percentiles cannot be added, so a bucket that several instances have
    /// takes the largest p95 and the p50 weighted by each instance's starts (waits) or ends
    /// (runs): an estimate, said so in docs/API.md.
    static func merge(_ pages: [HTTPResponse]) -> HTTPResponse? {
        struct Merged {
            var counts = [Double](repeating: 0, count: 5)
            var waitP50: (sum: Double, weight: Double) = (0, 0)
            var runP50: (sum: Double, weight: Double) = (0, 0)
            var waitP95: Double?
            var runP95: Double?
        }
        var step: Double = 60
        var buckets: [String: Merged] = [:]
        for page in pages {
            guard page.status == 200, let top = try? JSONValue.parse(page.body), case let .number(s)? = top["step"],
                case let .array(list)? = top["buckets"]
            else { return nil }
            step = s
            for b in list {
                guard case let .string(start)? = b["start"] else { return nil }
                var m = buckets[start] ?? Merged()
                for (i, k) in ["created", "started", "succeeded", "failed", "cancelled"].enumerated() {
                    if case let .number(n)? = b[k] { m.counts[i] += n }
                }
                let starts: Double = { if case let .number(n)? = b["started"] { return max(1, n) } else { return 1 } }()
                var ends = 0.0
                for k in ["succeeded", "failed", "cancelled"] { if case let .number(n)? = b[k] { ends += n } }
                if case let .number(v)? = b["waitP50"] { m.waitP50 = (m.waitP50.sum + v * starts, m.waitP50.weight + starts) }
                if case let .number(v)? = b["runP50"] { m.runP50 = (m.runP50.sum + v * max(1, ends), m.runP50.weight + max(1, ends)) }
                if case let .number(v)? = b["waitP95"] { m.waitP95 = max(m.waitP95 ?? v, v) }
                if case let .number(v)? = b["runP95"] { m.runP95 = max(m.runP95 ?? v, v) }
                buckets[start] = m
            }
        }
        var o = JSONOut(capacity: 64 + 200 * buckets.count)
        o.open()
        o.key("step"); o.number(step)
        o.key("buckets"); o.openArray()
        // RFC 3339 times of one format sort as the times do.
        for (start, m) in buckets.sorted(by: { $0.key < $1.key }) {
            o.open()
            o.key("start"); o.string(start)
            let names: [StaticString] = ["created", "started", "succeeded", "failed", "cancelled"]
            for (i, k) in names.enumerated() { o.key(k); o.number(m.counts[i]) }
            func p50(_ p: (sum: Double, weight: Double)) -> Double? { p.weight > 0 ? ((p.sum / p.weight) * 1000).rounded() / 1000 : nil }
            let values: [(StaticString, Double?)] = [("waitP50", p50(m.waitP50)), ("waitP95", m.waitP95), ("runP50", p50(m.runP50)), ("runP95", m.runP95)]
            for (k, v) in values {
                o.key(k)
                if let v { o.number(v) } else { o.null() }
            }
            o.close()
        }
        o.closeArray()
        o.close()
        return HTTPResponse(status: 200, headers: [("Content-Type", "application/json; charset=utf-8")], body: o.bytes)
    }
}
