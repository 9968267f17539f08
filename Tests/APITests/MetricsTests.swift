import Foundation
import QueueTesting
import Testing

@testable import QueueAPI

/// `/metrics` on a live server: the families it promises, histograms well formed, and
/// numbers that move when the things they count happen. (scripts/metrics-check.sh has a real
/// Prometheus scrape it and prometheus-client parse it.)
@Suite("Prometheus metrics")
struct MetricsTests {
    /// Every family `/metrics` promises (openapi.yaml lists them), with its type. The store
    /// families are there because live servers use SQLite.
    static let families: [(String, String)] = [
        ("opqd_operations", "gauge"), ("opqd_operations_created_total", "counter"), ("opqd_transitions_total", "counter"),
        ("opqd_operation_retries_total", "counter"), ("opqd_operation_queue_wait_seconds", "histogram"),
        ("opqd_operation_duration_seconds", "histogram"), ("opqd_events_total", "counter"), ("opqd_event_sequence", "gauge"),
        ("opqd_sse_streams", "gauge"), ("opqd_http_requests_total", "counter"), ("opqd_http_request_duration_seconds", "histogram"),
        ("opqd_http_open_connections", "gauge"), ("opqd_http_requests_in_flight", "gauge"), ("opqd_webhook_observers", "gauge"),
        ("opqd_webhook_deliveries_total", "counter"),
        ("opqd_webhook_delivery_failures_total", "counter"), ("opqd_webhook_events_dropped_total", "counter"),
        ("opqd_webhook_events_pending", "gauge"), ("opqd_store_commits_total", "counter"), ("opqd_store_records_total", "counter"),
        ("opqd_store_largest_commit", "gauge"), ("opqd_store_failures_total", "counter"),
        ("opqd_store_commit_duration_seconds", "histogram"), ("opqd_store_commit_records", "histogram"),
        ("process_start_time_seconds", "gauge"), ("process_cpu_seconds_total", "counter"), ("process_resident_memory_bytes", "gauge"),
        ("process_virtual_memory_bytes", "gauge"), ("process_open_fds", "gauge"),
        ("opqd_limiter_running", "gauge"), ("opqd_limiter_waiting", "gauge"), ("opqd_limiter_keys", "gauge"),
        ("opqd_limiter_tokens", "gauge"), ("opqd_starts_delayed_by_rate_total", "counter"), ("opqd_limiter_parked_total", "counter"),
        ("opqd_host_breaker_state", "gauge"), ("opqd_host_held", "gauge"), ("opqd_host_trips_total", "counter"),
        ("opqd_host_throttled_total", "counter"), ("opqd_host_held_total", "counter"),
        ("opqd_schedule_runs_total", "counter"), ("opqd_schedule_skipped_total", "counter"), ("opqd_schedule_missed_total", "counter"),
        ("opqd_schedule_lag_seconds", "histogram"),
    ]

    @Test("every promised family has HELP and TYPE, every sample belongs to a declared family, and histograms are cumulative with +Inf equal to _count")
    func wellFormed() async throws {
        try await withLiveServer { server in
            try await server.createQueue("shape")
            let id = try await server.addDelay("shape", seconds: 0.01)
            #expect(try await server.waitForState(id, "finished"))
            let page = try await server.scrape()
            for (name, type) in Self.families {
                #expect(page.types[name] == type, "TYPE of \(name): \(page.types[name] ?? "missing")")
                #expect(page.helps.contains(name), "HELP of \(name)")
            }
            #expect(page.problems.isEmpty, "\(page.problems)")
            // Histograms with samples: the queue's two, the store's two, and the HTTP latency of
            // the requests above.
            for name in ["opqd_operation_queue_wait_seconds", "opqd_operation_duration_seconds", "opqd_store_commit_duration_seconds"] {
                #expect(page.histograms(name).contains { $0.count > 0 }, "\(name) has an observation")
            }
            for h in page.allHistograms {
                #expect(h.le.last == .infinity, "\(h.name){\(h.labels)} ends with +Inf")
                #expect(h.le == h.le.sorted(), "\(h.name){\(h.labels)} bounds ascend")
                #expect(h.cumulative == h.cumulative.sorted(), "\(h.name){\(h.labels)} buckets are cumulative: \(h.cumulative)")
                #expect(h.cumulative.last == h.count, "\(h.name){\(h.labels)} +Inf \(h.cumulative) = _count \(h.count)")
                #expect(h.sum >= 0)
            }
        }
    }

    @Test("transitions, creations, queue wait, duration, events and store commits move when operations run")
    func countersMove() async throws {
        try await withLiveServer { server in
            try await server.createQueue("moving", maxConcurrent: 1, suspended: true)
            let before = try await server.scrape()
            #expect(before.value("opqd_operations_created_total", ["queue": "moving"]) == 0)
            #expect(before.value("opqd_transitions_total", ["queue": "moving", "to": "finished"]) == 0)
            let first = try await server.addDelay("moving", seconds: 0.2)
            let second = try await server.addDelay("moving", seconds: 0.01)
            // Paused and resumed while the queue is suspended: ready -> paused -> ready.
            try await server.request("POST", "/v1/operations/\(second)/pause").expecting(200, "pause")
            try await server.request("POST", "/v1/operations/\(second)/resume").expecting(200, "resume")
            try await server.request("POST", "/v1/queues/moving/resume").expecting(200, "resume queue")
            #expect(try await server.waitForState(first, "finished"))
            #expect(try await server.waitForState(second, "finished"))
            let after = try await server.scrape()
            let q = ["queue": "moving"]
            #expect(after.value("opqd_operations_created_total", q) == 2)
            #expect(after.value("opqd_transitions_total", ["queue": "moving", "to": "executing"]) == 2)
            #expect(after.value("opqd_transitions_total", ["queue": "moving", "to": "finished"]) == 2)
            #expect(after.value("opqd_transitions_total", ["queue": "moving", "to": "paused"]) == 1)
            #expect(after.value("opqd_transitions_total", ["queue": "moving", "to": "ready"]) == 1)
            #expect(after.value("opqd_operations", ["queue": "moving", "state": "finished"]) == 2)
            let duration = try #require(after.histograms("opqd_operation_duration_seconds").first { $0.labels == q })
            #expect(duration.count == 2)
            // The 0.2 s delay is above the 0.1 bound; both are below 5 s.
            #expect(duration.bucket(le: 0.1) <= 1 && duration.bucket(le: 5) == 2, "\(duration.cumulative)")
            #expect(duration.sum >= 0.2)
            let wait = try #require(after.histograms("opqd_operation_queue_wait_seconds").first { $0.labels == q })
            // The second waited for the first (a serial queue): at least its 0.2 s.
            #expect(wait.count == 2 && wait.sum >= 0.2, "\(wait)")
            #expect((after.value("opqd_events_total", [:]) ?? 0) > (before.value("opqd_events_total", [:]) ?? 0))
            #expect((after.value("opqd_store_commits_total", [:]) ?? 0) > (before.value("opqd_store_commits_total", [:]) ?? 0))
            let commits = try #require(after.histograms("opqd_store_commit_records").first)
            #expect(Double(commits.count) == after.value("opqd_store_commits_total", [:]))
        }
    }

    @Test("a failed attempt that is retried counts in opqd_operation_retries_total")
    func retriesCounted() async throws {
        try await withLiveServer { server in
            try await server.createQueue("flaky")
            let id = try #require(
                try await server.request(
                    "POST", "/v1/queues/flaky/operations", json: #"{"kind":"external","spec":{"lease":30},"retry":{"maxAttempts":2,"backoff":0}}"#
                ).expecting(201, "create").string("id"))
            #expect(try await server.scrape().value("opqd_operation_retries_total", ["queue": "flaky"]) == 0)
            let claim = try await server.request("POST", "/v1/queues/flaky/claim?wait=2", json: "{}").expecting(200, "claim")
            let token = try #require((claim.object["lease"] as? [String: Any])?["token"] as? String)
            try await server.request(
                "POST", "/v1/operations/\(id)/finish", json: #"{"leaseToken":"\#(token)","error":{"type":"flaky","detail":"first try"}}"#
            ).expecting(200, "finish with an error")
            #expect(try await eventually { try await server.scrape().value("opqd_operation_retries_total", ["queue": "flaky"]) == 1 })
        }
    }

    @Test("the latency histogram counts each answer under its route, a long poll with the time it was held")
    func latencyHistogram() async throws {
        try await withLiveServer { server in
            // Suspended with one operation: the long poll below is held until its deadline.
            try await server.createQueue("timed", suspended: true)
            try await server.addDelay("timed", seconds: 0)
            for _ in 0..<3 { try await server.request("GET", "/v1/queues").expecting(200, "list") }
            let wait = try await server.request("GET", "/v1/queues/timed/wait?timeout=0.3")
            #expect(wait.status == 200 && wait.bool("timedOut") == true, "\(wait)")
            let page = try await server.scrape()
            let list = try #require(page.histograms("opqd_http_request_duration_seconds").first { $0.labels == ["method": "GET", "route": "/v1/queues"] })
            #expect(list.count == 3, "\(list)")
            #expect(page.value("opqd_http_requests_total", ["method": "GET", "route": "/v1/queues", "code": "200"]) == 3)
            let held = try #require(
                page.histograms("opqd_http_request_duration_seconds").first { $0.labels == ["method": "GET", "route": "/v1/queues/{name}/wait"] })
            #expect(held.count == 1)
            #expect(held.sum >= 0.29 && held.bucket(le: 0.25) == 0 && held.bucket(le: 1) == 1, "\(held)")
        }
    }

    @Test("the open-connection and SSE-stream gauges follow clients that come and go")
    func gaugesMove() async throws {
        try await withLiveServer { server in
            let base = try await server.scrape().value("opqd_http_open_connections", [:]) ?? -1
            let port = server.port
            let idle = try (0..<3).map { _ in try RawConnection(port: port, timeout: 5) }
            #expect(try await eventually { try await server.scrape().value("opqd_http_open_connections", [:]) ?? 0 >= base + 3 })
            for c in idle { c.close() }
            #expect(try await eventually { try await server.scrape().value("opqd_http_open_connections", [:]) ?? 99 <= base })

            #expect(try await server.scrape().value("opqd_sse_streams", [:]) == 0)
            // The scrape itself is in flight while it is rendered (eventually: the previous
            // request completes on its server thread a moment after its last byte went out).
            #expect(try await eventually { try await server.scrape().value("opqd_http_requests_in_flight", [:]) == 1 })
            let stream = try RawConnection(port: port, timeout: 5)
            stream.send(RawConnection.head("GET", "/v1/events/stream", headers: [:], contentLength: nil))
            _ = try stream.readHead()
            #expect(try await eventually { try await server.scrape().value("opqd_sse_streams", [:]) == 1 })
            #expect(try await eventually { try await server.scrape().value("opqd_http_requests_in_flight", [:]) == 2 })
            stream.close()
            // A waiting stream is suspended, and MHD does not watch a suspended connection: the
            // server notices the client left when a write to it fails (the first write after
            // the close may still be accepted by the kernel). Keep making changes.
            try await server.createQueue("poke")
            #expect(
                try await eventually(every: 0.02) {
                    try await server.addDelay("poke", seconds: 0)
                    return try await server.scrape().value("opqd_sse_streams", [:]) == 0
                })
        }
    }

    @Test("a deleted queue's series go away at a later scrape")
    func deletedQueuesPruned() async throws {
        try await withLiveServer { server in
            try await server.createQueue("fleeting")
            #expect(try await server.scrape().value("opqd_transitions_total", ["queue": "fleeting", "to": "ready"]) == 0)
            let deleted = try await server.request("DELETE", "/v1/queues/fleeting")
            #expect(deleted.status == 200 || deleted.status == 204, "\(deleted)")
            _ = try await server.scrape()
            let later = try await server.scrape()
            #expect(later.value("opqd_transitions_total", ["queue": "fleeting", "to": "ready"]) == nil)
            #expect(later.value("opqd_operations", ["queue": "fleeting", "state": "ready"]) == nil)
        }
    }

    @Test("label values and HELP text are escaped as the exposition format says")
    func escaping() {
        #expect(prometheusEscaped(#"a"b\c"# + "\nd") == #"a\"b\\c\nd"#)
        #expect(prometheusEscaped("plain-name_1.2") == "plain-name_1.2")
        #expect(prometheusNumber(.infinity) == "+Inf" && prometheusNumber(-.infinity) == "-Inf" && prometheusNumber(.nan) == "NaN")
        #expect(prometheusNumber(2) == "2" && prometheusNumber(0.25) == "0.25")
        var e = Exposition()
        e.family("x_total", .counter, "one \\ two\nthree")
        #expect(String(decoding: e.bytes, as: UTF8.self) == "# HELP x_total one \\\\ two\\nthree\n# TYPE x_total counter\n")
        var h = MetricsHistogram(buckets: 2)
        h.observe(bucket: Metrics.bucket(of: 0.5, in: [1, 2]), value: 0.5)
        h.observe(bucket: Metrics.bucket(of: 3, in: [1, 2]), value: 3)
        var out = Exposition()
        out.histogram("h_seconds", "queue=\"q\"", [1, 2], h)
        #expect(
            String(decoding: out.bytes, as: UTF8.self)
                == """
                h_seconds_bucket{queue="q",le="1"} 1
                h_seconds_bucket{queue="q",le="2"} 1
                h_seconds_bucket{queue="q",le="+Inf"} 2
                h_seconds_sum{queue="q"} 3.5
                h_seconds_count{queue="q"} 2

                """)
    }
}

// MARK: - a strict reader of the text format, for these tests

/// One scrape of `/metrics`, parsed line by line; anything that is not a comment, a blank line
/// or a well-formed sample of a declared family is recorded in `problems`.
struct MetricsPage {
    struct Sample {
        var name: String
        var labels: [String: String]
        var value: Double
    }
    struct HistogramSeries: CustomStringConvertible {
        var name: String
        var labels: [String: String]
        var le: [Double] = []
        var cumulative: [UInt64] = []
        var sum = -1.0
        var count: UInt64 = 0
        func bucket(le bound: Double) -> UInt64 { zip(le, cumulative).first { $0.0 == bound }?.1 ?? UInt64.max }
        var description: String { "\(name)\(labels) le=\(le) buckets=\(cumulative) sum=\(sum) count=\(count)" }
    }

    var types: [String: String] = [:]
    var helps: Set<String> = []
    var samples: [Sample] = []
    var problems: [String] = []

    init(_ text: String) {
        for line in text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init) where !line.isEmpty {
            if line.hasPrefix("# HELP ") {
                let rest = line.dropFirst(7)
                helps.insert(String(rest.prefix { $0 != " " }))
            } else if line.hasPrefix("# TYPE ") {
                let parts = line.dropFirst(7).split(separator: " ")
                guard parts.count == 2 else { problems.append("bad TYPE: \(line)"); continue }
                if types[String(parts[0])] != nil { problems.append("TYPE twice: \(line)") }
                types[String(parts[0])] = String(parts[1])
            } else if line.hasPrefix("#") {
                continue
            } else if let sample = Self.parse(line) {
                let family = types[sample.name] != nil ? sample.name : Self.histogramFamily(of: sample.name)
                if let family, types[family] != nil {
                    if types[family] == "histogram" && family == sample.name { problems.append("bare histogram sample: \(line)") }
                } else {
                    problems.append("sample of an undeclared family: \(line)")
                }
                samples.append(sample)
            } else {
                problems.append("unparsable: \(line)")
            }
        }
    }

    private static func histogramFamily(of name: String) -> String? {
        for suffix in ["_bucket", "_sum", "_count"] where name.hasSuffix(suffix) { return String(name.dropLast(suffix.count)) }
        return nil
    }

    /// `name{a="x",b="y"} value` (label values with `\\`, `\"`, `\n` escapes).
    static func parse(_ line: String) -> Sample? {
        var chars = Array(line.unicodeScalars)[...]
        var name = ""
        while let c = chars.first, c == "_" || c == ":" || ("a"..."z").contains(c) || ("A"..."Z").contains(c) || ("0"..."9").contains(c) {
            name.unicodeScalars.append(c)
            chars = chars.dropFirst()
        }
        guard !name.isEmpty else { return nil }
        var labels: [String: String] = [:]
        if chars.first == "{" {
            chars = chars.dropFirst()
            while chars.first != "}" {
                var key = ""
                while let c = chars.first, c != "=" {
                    key.unicodeScalars.append(c)
                    chars = chars.dropFirst()
                }
                guard chars.first == "=", chars.dropFirst().first == "\"" else { return nil }
                chars = chars.dropFirst(2)
                var value = ""
                while let c = chars.first, c != "\"" {
                    chars = chars.dropFirst()
                    if c == "\\" {
                        guard let next = chars.first else { return nil }
                        chars = chars.dropFirst()
                        switch next {
                        case "\\": value += "\\"
                        case "\"": value += "\""
                        case "n": value += "\n"
                        default: return nil
                        }
                    } else {
                        value.unicodeScalars.append(c)
                    }
                }
                guard chars.first == "\"" else { return nil }
                chars = chars.dropFirst()
                labels[key] = value
                if chars.first == "," { chars = chars.dropFirst() }
            }
            chars = chars.dropFirst()
        }
        guard chars.first == " " else { return nil }
        let text = String(String.UnicodeScalarView(chars.dropFirst()))
        let value: Double? =
            switch text {
            case "+Inf": .infinity
            case "-Inf": -.infinity
            case "NaN": .nan
            default: Double(text)
            }
        guard let value else { return nil }
        return Sample(name: name, labels: labels, value: value)
    }

    /// The value of the sample with exactly these labels; nil when there is none.
    func value(_ name: String, _ labels: [String: String]) -> Double? {
        samples.first { $0.name == name && $0.labels == labels }?.value
    }

    func histograms(_ name: String) -> [HistogramSeries] {
        var series: [[String: String]: HistogramSeries] = [:]
        var order: [[String: String]] = []
        for s in samples where s.name.hasPrefix(name + "_") {
            var key = s.labels
            key["le"] = nil
            if series[key] == nil {
                series[key] = HistogramSeries(name: name, labels: key)
                order.append(key)
            }
            switch s.name.dropFirst(name.count) {
            case "_bucket":
                series[key]?.le.append(s.labels["le"].flatMap { $0 == "+Inf" ? .infinity : Double($0) } ?? .nan)
                series[key]?.cumulative.append(UInt64(s.value))
            case "_sum": series[key]?.sum = s.value
            case "_count": series[key]?.count = UInt64(s.value)
            default: break
            }
        }
        return order.compactMap { series[$0] }
    }

    var allHistograms: [HistogramSeries] {
        types.filter { $0.value == "histogram" }.keys.sorted().flatMap { histograms($0) }
    }
}

extension LiveServer {
    /// `GET /metrics`, checked and parsed.
    func scrape() async throws -> MetricsPage {
        let r = try await request("GET", "/metrics").expecting(200, "scraping /metrics")
        #expect(r.headers["content-type"]?.hasPrefix("text/plain; version=0.0.4") == true)
        return MetricsPage(r.text)
    }
}
