import Locking
import QueueEngine
import QueueStore
import Synchronization

/// Prometheus counters fed by the engine's observer and by the HTTP server as answers leave.
final class Metrics: Sendable {
    /// Answers by route label (`GET /v1/queues/{name}`, `Router.unmatched`, or `serverAnswer`
    /// for the server's own: 413, 431, 400, 503 while stopping) and status. Bounded: labels come
    /// from the router, never from a request.
    private let requests = Lock<[String: [Int: UInt64]]>([:])
    private let transitions = Lock<[String: UInt64]>([:])
    /// Start times of executing operations, for the duration histogram.
    private let running = Lock<[UInt64: Timestamp]>([:])
    static let buckets: [Double] = [0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 60, 300, 3600]
    private let durations = Lock<(counts: [UInt64], sum: Double, count: UInt64)>(([UInt64](repeating: 0, count: 12), 0, 0))

    static let serverAnswer = "- server"

    /// One answer that left, under the route the dispatcher named (nil: the server's own).
    func countRequest(route: String?, status: Int) {
        requests.withLock { $0[route ?? Self.serverAnswer, default: [:]][status, default: 0] += 1 }
    }

    func observe(_ events: [ChangeEvent]) {
        var finished: [(Double)] = []
        transitions.withLock { t in
            for e in events { t["\(e.key.rawValue)|\(e.new.label)", default: 0] += 1 }
        }
        running.withLock { r in
            for e in events where e.key == .isExecuting || e.key == .isFinished {
                if e.key == .isExecuting, e.new == .bool(true) { r[e.operation.raw] = e.time }
                if e.key == .isFinished, e.new == .bool(true), let s = r.removeValue(forKey: e.operation.raw) {
                    finished.append(Double(e.time.nanoseconds - s.nanoseconds) / 1e9)
                }
            }
        }
        guard !finished.isEmpty else { return }
        durations.withLock { d in
            for f in finished {
                let i = Self.buckets.firstIndex { f <= $0 } ?? Self.buckets.count
                d.counts[i] += 1
                d.sum += f
                d.count += 1
            }
        }
    }

    func render(engine: QueueEngine, lastSeq: UInt64, store: StoreStats? = nil) -> [UInt8] {
        var s = "# HELP opqd_operations Operations by queue and state.\n# TYPE opqd_operations gauge\n"
        for (queue, counts) in engine.stateCounts() {
            for st in OperationState.allCases {
                s += "opqd_operations{queue=\"\(queue)\",state=\"\(st.rawValue)\"} \(counts[st] ?? 0)\n"
            }
        }
        s += "# HELP opqd_transitions_total Observed changes by key and new value.\n# TYPE opqd_transitions_total counter\n"
        for (k, v) in transitions.withLock({ $0 }).sorted(by: { $0.key < $1.key }) {
            let parts = k.split(separator: "|", maxSplits: 1)
            s += "opqd_transitions_total{key=\"\(parts[0])\",new=\"\(parts.count > 1 ? String(parts[1]) : "")\"} \(v)\n"
        }
        let d = durations.withLock { $0 }
        s += "# HELP opqd_operation_duration_seconds Time from start to finish of operations.\n# TYPE opqd_operation_duration_seconds histogram\n"
        var cumulative: UInt64 = 0
        for (i, b) in Self.buckets.enumerated() {
            cumulative += d.counts[i]
            s += "opqd_operation_duration_seconds_bucket{le=\"\(b)\"} \(cumulative)\n"
        }
        s += "opqd_operation_duration_seconds_bucket{le=\"+Inf\"} \(d.count)\n"
        s += "opqd_operation_duration_seconds_sum \(d.sum)\nopqd_operation_duration_seconds_count \(d.count)\n"
        s +=
            "# HELP opqd_http_requests_total HTTP answers sent, by method, route pattern and status (route \"server\": the server's own answers, e.g. 413 or 503 while stopping; \"unmatched\": 404, 405 and refused tokens or targets).\n# TYPE opqd_http_requests_total counter\n"
        for (label, counts) in requests.withLock({ $0 }).sorted(by: { $0.key < $1.key }) {
            let parts = label.split(separator: " ", maxSplits: 1)
            let (method, route) = parts.count == 2 ? (String(parts[0]), String(parts[1])) : ("", label)
            for (status, n) in counts.sorted(by: { $0.key < $1.key }) {
                s += "opqd_http_requests_total{method=\"\(method)\",route=\"\(route)\",code=\"\(status)\"} \(n)\n"
            }
        }
        if let st = store {
            s +=
                "# HELP opqd_store_commits_total SQLite transactions committed (group commits).\n# TYPE opqd_store_commits_total counter\nopqd_store_commits_total \(st.commits)\n"
            s += "# HELP opqd_store_records_total Records made durable.\n# TYPE opqd_store_records_total counter\nopqd_store_records_total \(st.records)\n"
            s +=
                "# HELP opqd_store_largest_commit Most records in one commit.\n# TYPE opqd_store_largest_commit gauge\nopqd_store_largest_commit \(st.largestCommit)\n"
            s +=
                "# HELP opqd_store_failures_total Commits that failed and were retried.\n# TYPE opqd_store_failures_total counter\nopqd_store_failures_total \(st.failures)\n"
        }
        s += "# HELP opqd_event_sequence The newest change's sequence number.\n# TYPE opqd_event_sequence gauge\nopqd_event_sequence \(lastSeq)\n"
        return Array(s.utf8)
    }
}

extension ChangeValue {
    var label: String {
        switch self {
        case .none: return "none"
        case let .bool(b): return b ? "true" : "false"
        case let .priority(p): return p.name
        case .progress: return "progress"
        case .int: return "int"
        }
    }
}
