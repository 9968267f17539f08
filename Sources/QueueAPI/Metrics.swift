import Glibc
import Locking
import QueueEngine
import StoreKit

/// What `/metrics` shows, in the Prometheus text format (0.0.4), written by hand (see
/// `render`). Fed from three places, each kept cheap because each is on a hot path:
/// - the engine's observer (`observe`): one lock per batch of changes, no string building;
/// - the HTTP server as every answer leaves (`answered`): one lock, one lookup of the route
///   label the router made once, a few increments;
/// - read at scrape time: the engine's maintained counts, the store's, the webhooks', the
///   server's connections, the event log's streams and `/proc/self`.
package final class Metrics: Sendable {
    /// Operation duration and queue wait: 5 ms (a `delay` of 0) to an hour.
    static let operationBounds: [Double] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600]
    /// HTTP latency: 100 µs (a status read) to a minute (a long poll's deadline).
    static let httpBounds: [Double] = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60]
    /// Route label of the server's own answers (413, 431, 400, 503 while stopping).
    static let serverAnswer = "- server"

    private let engineSide = Lock(MetricsEngineSide())
    private let http = Lock(MetricsHTTPSide())
    /// The HTTP server's open connections and requests in flight, set once the server exists
    /// (it is built after the router that serves `/metrics`).
    private let server = Lock<(@Sendable () -> (connections: Int, inFlight: Int))?>(nil)
    private let processStart: Double

    package init() {
        processStart = ProcessStats.startTime() ?? ProcessStats.now()
    }

    /// Tells where the server's gauges come from.
    package func readServer(_ read: @escaping @Sendable () -> (connections: Int, inFlight: Int)) {
        server.withLock { $0 = read }
    }

    // MARK: - HTTP answers (every request)

    /// One answer that left, under the route the dispatcher named (nil: the server's own), with
    /// the time from the request's arrival until the answer was queued for sending.
    package func answered(route: String?, status: Int, duration: Duration) {
        let (s, atto) = duration.components
        let seconds = max(0, Double(s) + Double(atto) * 1e-18)
        let bucket = Self.bucket(of: seconds, in: Self.httpBounds)
        let key = route ?? Self.serverAnswer
        http.withLock { h in
            let i: Int
            if let known = h.index[key] {
                i = known
            } else {
                // Once per route: the label set is bounded by the router's table.
                i = h.series.count
                h.series.append(MetricsRouteSeries(label: key))
                h.index[key] = i
            }
            h.series[i].count(status)
            h.series[i].latency.observe(bucket: bucket, value: seconds)
        }
    }

    // MARK: - engine changes (every batch)

    /// Counts a batch of changes: transitions by queue and the state moved to, creations,
    /// retries, and the two per-queue histograms (queue wait, duration).
    package func observe(_ events: [ChangeEvent]) {
        guard !events.isEmpty else { return }
        engineSide.withLock { side in
            side.events &+= UInt64(events.count)
            for e in events { side.apply(e) }
        }
    }

    // MARK: - rendering (each scrape)

    /// `cluster`: the placement's own families (`QueuePlacement.write(metrics:)`), last.
    func render(
        engine: QueueEngine, events: EventLog, webhooks: WebhookMetrics, store: StoreStats?, cluster: (inout Exposition) -> Void = { _ in }
    ) -> [UInt8] {
        let counts = engine.stateCounts()
        let live = Set(counts.map(\.queue))
        let (queues, totalEvents) = engineSide.withLock { side in
            side.prune(keeping: live)
            return (side.queues.sorted { $0.key < $1.key }, side.events)
        }
        let routes = http.withLock { $0.series }.sorted { $0.label < $1.label }
        var out = Exposition()

        out.family("opqd_operations", .gauge, "Operations by queue and state.")
        for (queue, perState) in counts.sorted(by: { $0.queue < $1.queue }) {
            let q = prometheusEscaped(queue)
            for st in OperationState.allCases {
                out.sample("opqd_operations", "queue=\"\(q)\",state=\"\(st.rawValue)\"", perState[st] ?? 0)
            }
        }
        out.family("opqd_operations_created_total", .counter, "Operations created, by queue.")
        for (queue, series) in queues { out.sample("opqd_operations_created_total", "queue=\"\(prometheusEscaped(queue))\"", series.created) }
        out.family(
            "opqd_transitions_total", .counter,
            "Operations that moved into a state, by queue and that state (creation is counted in opqd_operations_created_total).")
        for (queue, series) in queues {
            let q = prometheusEscaped(queue)
            for st in OperationState.allCases {
                out.sample("opqd_transitions_total", "queue=\"\(q)\",to=\"\(st.rawValue)\"", series.transitions[st.metricsIndex])
            }
        }
        out.family("opqd_operation_retries_total", .counter, "Operations run again after a failed attempt (retry) or an unclean stop, by queue.")
        for (queue, series) in queues { out.sample("opqd_operation_retries_total", "queue=\"\(prometheusEscaped(queue))\"", series.retries) }
        out.family(
            "opqd_operation_queue_wait_seconds", .histogram,
            "Time an operation waited for a slot: from becoming ready (at creation or later) to starting to execute, by queue.")
        for (queue, series) in queues {
            out.histogram("opqd_operation_queue_wait_seconds", "queue=\"\(prometheusEscaped(queue))\"", Self.operationBounds, series.wait)
        }
        out.family("opqd_operation_duration_seconds", .histogram, "Time from an operation's first start to its finish, by queue.")
        for (queue, series) in queues {
            out.histogram("opqd_operation_duration_seconds", "queue=\"\(prometheusEscaped(queue))\"", Self.operationBounds, series.duration)
        }

        let flow = engine.flowMetrics()
        out.family("opqd_limiter_running", .gauge, "Executing operations that name the limiter, over all its keys.")
        for l in flow.limiters { out.sample("opqd_limiter_running", "limiter=\"\(prometheusEscaped(l.name))\"", l.running) }
        out.family("opqd_limiter_waiting", .gauge, "Ready operations that name the limiter and have not started, over all its keys.")
        for l in flow.limiters { out.sample("opqd_limiter_waiting", "limiter=\"\(prometheusEscaped(l.name))\"", l.waiting) }
        out.family("opqd_limiter_keys", .gauge, "Keys of the limiter in use.")
        for l in flow.limiters { out.sample("opqd_limiter_keys", "limiter=\"\(prometheusEscaped(l.name))\"", l.keys) }
        out.family("opqd_limiter_tokens", .gauge, "Tokens in the rate buckets of the limiter's keys in use, summed (limiters with a rate).")
        for l in flow.limiters {
            if let t = l.tokens { out.sample("opqd_limiter_tokens", "limiter=\"\(prometheusEscaped(l.name))\"", t) }
        }
        out.family("opqd_starts_delayed_by_rate_total", .counter, "Starts held back by a rate limit, each start once, by what held it (queue or limiter).")
        out.sample("opqd_starts_delayed_by_rate_total", "by=\"queue\"", flow.counters.delayedByQueueRate)
        out.sample("opqd_starts_delayed_by_rate_total", "by=\"limiter\"", flow.counters.delayedByLimiterRate)
        out.family("opqd_limiter_parked_total", .counter, "Ready operations parked on a limiter key that had no room for them.")
        out.sample("opqd_limiter_parked_total", "", flow.counters.parked)

        let scheduled = engine.scheduleMetrics()
        let bySchedule = scheduled.schedules.sorted { ($0.queue, $0.name) < ($1.queue, $1.name) }
        for (family, help, value) in [
            ("opqd_schedule_runs_total", "Runs a schedule created (operations), since the schedule was made.", \ScheduleCounts.runs),
            ("opqd_schedule_skipped_total", "Nominal times a schedule skipped (its overlap policy, or passed while paused).", \ScheduleCounts.skipped),
            (
                "opqd_schedule_missed_total", "Nominal times that got no run (passed while the server was stopped, beyond the catch-up policy).",
                \ScheduleCounts.missed
            ),
        ] {
            out.family(family, .counter, help)
            for s in bySchedule { out.sample(family, "queue=\"\(prometheusEscaped(s.queue))\",schedule=\"\(prometheusEscaped(s.name))\"", s[keyPath: value]) }
        }
        out.family("opqd_schedule_lag_seconds", .histogram, "How late a schedule's run was created after its time (nominal time plus jitter).")
        out.histogram(
            "opqd_schedule_lag_seconds", "", ScheduleLag.bounds,
            MetricsHistogram(counts: scheduled.lag.counts, sum: scheduled.lag.sum, count: scheduled.lag.count))

        let hosts = engine.hostMetrics()
        let byHost = hosts.hosts.sorted { $0.host < $1.host }
        out.family("opqd_host_breaker_state", .gauge, "A host's breaker: 1 for its state now, 0 for the others (API.md Hosts).")
        for h in byHost {
            let name = prometheusEscaped(h.host)
            for st in BreakerState.allCases {
                out.sample("opqd_host_breaker_state", "host=\"\(name)\",state=\"\(st.rawValue)\"", h.state == st ? 1 : 0)
            }
        }
        out.family("opqd_host_held", .gauge, "Ready operations held back by the host's breaker (parked on it).")
        for h in byHost { out.sample("opqd_host_held", "host=\"\(prometheusEscaped(h.host))\"", h.held) }
        out.family("opqd_host_trips_total", .counter, "Times the host's breaker opened (from closed, or again after a failed canary or ramp), since the start.")
        for h in byHost { out.sample("opqd_host_trips_total", "host=\"\(prometheusEscaped(h.host))\"", h.trips) }
        out.family("opqd_host_throttled_total", .counter, "Answers asking to slow down (429, or 503 with Retry-After), over all hosts.")
        out.sample("opqd_host_throttled_total", "", hosts.counters.throttles)
        out.family("opqd_host_held_total", .counter, "Starts held back by a host's breaker (operations parked on a host), over all hosts.")
        out.sample("opqd_host_held_total", "", hosts.counters.held)

        out.family("opqd_events_total", .counter, "Changes reported (each is one event of the feed); events per second is rate() of it.")
        out.sample("opqd_events_total", "", totalEvents)
        out.family("opqd_event_sequence", .gauge, "The newest durable change's sequence number.")
        out.sample("opqd_event_sequence", "", events.lastSeq)
        out.family("opqd_sse_streams", .gauge, "Open Server-Sent Events streams (GET /v1/events/stream).")
        out.sample("opqd_sse_streams", "", events.streamCount)

        out.family(
            "opqd_http_requests_total", .counter,
            "HTTP answers sent, by method, route pattern and status (route \"server\": the server's own answers, e.g. 413 or 503 while stopping; \"unmatched\": 404, 405 and refused tokens or targets)."
        )
        for r in routes {
            for (status, n) in r.statuses.sorted(by: { $0.status < $1.status }) {
                out.sample("opqd_http_requests_total", r.labels + ",code=\"\(status)\"", n)
            }
        }
        out.family(
            "opqd_http_request_duration_seconds", .histogram,
            "Time from a request's arrival (its request line) until its answer was queued for sending (a deferred answer: when it was given; a stream: its head), by method and route pattern."
        )
        for r in routes { out.histogram("opqd_http_request_duration_seconds", r.labels, Self.httpBounds, r.latency) }
        let (connections, inFlight) = server.value?() ?? (0, 0)
        out.family("opqd_http_open_connections", .gauge, "Open HTTP connections, idle keep-alive ones included.")
        out.sample("opqd_http_open_connections", "", connections)
        out.family(
            "opqd_http_requests_in_flight", .gauge,
            "Requests received and not yet completed (this scrape, held long polls and open streams included).")
        out.sample("opqd_http_requests_in_flight", "", inFlight)

        out.family("opqd_webhook_observers", .gauge, "Registered webhook observers (operation and queue observers).")
        out.sample("opqd_webhook_observers", "", webhooks.observers)
        out.family("opqd_webhook_deliveries_total", .counter, "Webhook deliveries a receiver answered with a 2xx.")
        out.sample("opqd_webhook_deliveries_total", "", webhooks.delivered)
        out.family(
            "opqd_webhook_delivery_failures_total", .counter, "Webhook delivery attempts that failed (non-2xx, timeout, no connection); each is retried.")
        out.sample("opqd_webhook_delivery_failures_total", "", webhooks.failed)
        out.family(
            "opqd_webhook_events_dropped_total", .counter,
            "Events a webhook observer could not hold (past --webhook-buffer with --store memory, which keeps no history to read them back from).")
        out.sample("opqd_webhook_events_dropped_total", "", webhooks.dropped)
        out.family("opqd_webhook_events_pending", .gauge, "Events matched by webhook observers and not delivered yet, summed over observers.")
        out.sample("opqd_webhook_events_pending", "", webhooks.pending)

        if let st = store {
            out.family("opqd_store_commits_total", .counter, "Store transactions committed (group commits).")
            out.sample("opqd_store_commits_total", "", st.commits)
            out.family("opqd_store_records_total", .counter, "Records made durable.")
            out.sample("opqd_store_records_total", "", st.records)
            out.family("opqd_store_largest_commit", .gauge, "Most records in one commit since the start.")
            out.sample("opqd_store_largest_commit", "", st.largestCommit)
            out.family("opqd_store_failures_total", .counter, "Commits that failed and were retried.")
            out.sample("opqd_store_failures_total", "", st.failures)
            out.family("opqd_store_commit_duration_seconds", .histogram, "Wall-clock time of each store commit, fsync included.")
            out.histogram("opqd_store_commit_duration_seconds", "", st.commitSeconds)
            out.family("opqd_store_commit_records", .histogram, "Records per store commit (how much group commit batches).")
            out.histogram("opqd_store_commit_records", "", st.commitRecords)
        }

        let process = ProcessStats.read()
        out.family("process_start_time_seconds", .gauge, "Start time of the process since the Unix epoch in seconds.")
        out.sample("process_start_time_seconds", "", processStart)
        if let cpu = process.cpuSeconds {
            out.family("process_cpu_seconds_total", .counter, "User and system CPU time spent in seconds.")
            out.sample("process_cpu_seconds_total", "", cpu)
        }
        if let rss = process.residentBytes {
            out.family("process_resident_memory_bytes", .gauge, "Resident memory size in bytes.")
            out.sample("process_resident_memory_bytes", "", rss)
        }
        if let vsz = process.virtualBytes {
            out.family("process_virtual_memory_bytes", .gauge, "Virtual memory size in bytes.")
            out.sample("process_virtual_memory_bytes", "", vsz)
        }
        if let fds = process.openFDs {
            out.family("process_open_fds", .gauge, "Number of open file descriptors.")
            out.sample("process_open_fds", "", fds)
        }
        cluster(&out)
        return out.bytes
    }

    /// The index of the first bound `value` fits under (`bounds.count`: above them all).
    static func bucket(of value: Double, in bounds: [Double]) -> Int {
        var i = 0
        while i < bounds.count && !(value <= bounds[i]) { i += 1 }
        return i
    }
}

// MARK: - the series

/// Counts of one histogram: `counts[i]` observations fell in bucket `i` (not cumulative; the
/// last is above every bound). Cumulated when rendered.
struct MetricsHistogram: Sendable {
    var counts: [UInt64]
    var sum: Double = 0
    var count: UInt64 = 0

    init(buckets: Int) { counts = [UInt64](repeating: 0, count: buckets + 1) }
    init(counts: [UInt64], sum: Double, count: UInt64) {
        self.counts = counts; self.sum = sum; self.count = count
    }

    mutating func observe(bucket: Int, value: Double) {
        counts[bucket] &+= 1
        sum += value
        count &+= 1
    }
}

/// One queue's counters and histograms.
struct MetricsQueueSeries: Sendable {
    var created: UInt64 = 0
    var retries: UInt64 = 0
    /// Indexed by `OperationState.metricsIndex`.
    var transitions = [UInt64](repeating: 0, count: OperationState.allCases.count)
    var wait = MetricsHistogram(buckets: Metrics.operationBounds.count)
    var duration = MetricsHistogram(buckets: Metrics.operationBounds.count)
    /// The scrape generation that last saw this queue (see `prune`).
    var touched: UInt64 = 0

    init(touched: UInt64 = 0) { self.touched = touched }
}

/// Per-queue series and what the histograms need to remember per unfinished operation.
struct MetricsEngineSide: Sendable {
    var queues: [String: MetricsQueueSeries] = [:]
    /// Operation → its queue and when it became ready (cleared when it starts or leaves ready).
    var readySince: [UInt64: (queue: String, at: Int64)] = [:]
    /// Operation → its queue and when it first started executing (cleared when it finishes).
    var started: [UInt64: (queue: String, at: Int64)] = [:]
    var events: UInt64 = 0
    var generation: UInt64 = 0

    /// One change. The engine reports each move as the boolean keys that turned off, then
    /// those that turned on (`EngineCore.apply`), so a move into ready, executing, paused or
    /// finished is its key turning on; a move into pending (a dependency added to a ready
    /// operation, a paused one resumed while dependencies are unfinished) is `isReady` or
    /// `isPaused` turning off with the state now pending. Creation is `isReady` from nothing.
    mutating func apply(_ e: ChangeEvent) {
        // A queue first seen now is kept at least until the next scrape has had a look.
        let g = generation
        let id = e.operation.raw
        let t = e.time.nanoseconds
        let on: Bool
        switch e.new {
        case .bool(let b): on = b
        default: on = false
        }
        switch e.key {
        case .isReady:
            if case .none = e.old {
                queues[e.queue, default: MetricsQueueSeries(touched: g)].created &+= 1
                if on { readySince[id] = (e.queue, t) }
            } else if on {
                bump(e.queue, .ready)
                readySince[id] = (e.queue, t)
            } else if e.state == .pending {
                bump(e.queue, .pending)
                readySince[id] = nil
            }
        case .isExecuting where on:
            bump(e.queue, .executing)
            if let ready = readySince.removeValue(forKey: id) {
                observe(\.wait, e.queue, seconds(from: ready.at, to: t))
            }
            if started[id] == nil { started[id] = (e.queue, t) }
        case .isPaused:
            if on {
                bump(e.queue, .paused)
                readySince[id] = nil
            } else if e.state == .pending {
                bump(e.queue, .pending)
            }
        case .isFinished where on:
            bump(e.queue, .finished)
            readySince[id] = nil
            if let start = started.removeValue(forKey: id) {
                observe(\.duration, e.queue, seconds(from: start.at, to: t))
            }
        case .attempt:
            queues[e.queue, default: MetricsQueueSeries(touched: g)].retries &+= 1
        default:
            break
        }
    }

    private mutating func bump(_ queue: String, _ state: OperationState) {
        let g = generation
        queues[queue, default: MetricsQueueSeries(touched: g)].transitions[state.metricsIndex] &+= 1
    }

    private mutating func observe(_ histogram: WritableKeyPath<MetricsQueueSeries, MetricsHistogram>, _ queue: String, _ seconds: Double) {
        let bucket = Metrics.bucket(of: seconds, in: Metrics.operationBounds)
        let g = generation
        queues[queue, default: MetricsQueueSeries(touched: g)][keyPath: histogram].observe(bucket: bucket, value: seconds)
    }

    private func seconds(from start: Int64, to end: Int64) -> Double {
        // Wall-clock times: a step back of the clock gives 0, not a negative duration.
        end > start ? Double(end &- start) / 1e9 : 0
    }

    /// Once per scrape: every existing queue gets its series (zeros until something happens);
    /// a deleted queue's series and remembered operations go once a scrape has not seen it
    /// (a queue first seen by a change since the previous scrape is kept: it may have been
    /// created after the engine's counts were read). Keeps the label sets bounded by the
    /// queues that exist.
    mutating func prune(keeping live: Set<String>) {
        generation &+= 1
        for name in live { queues[name, default: MetricsQueueSeries()].touched = generation }
        // `touched` is set to the current generation for live queues above; a queue that is
        // gone keeps the generation of the scrape that last saw it.
        let gone = queues.filter { !live.contains($0.key) && $0.value.touched &+ 1 < generation }.map(\.key)
        guard !gone.isEmpty else { return }
        let goneSet = Set(gone)
        for name in gone { queues[name] = nil }
        readySince = readySince.filter { !goneSet.contains($0.value.queue) }
        started = started.filter { !goneSet.contains($0.value.queue) }
    }
}

/// One route's answers: counts by status and the latency histogram.
struct MetricsRouteSeries: Sendable {
    let label: String
    /// `method="GET",route="/v1/queues/{name}"`, made once when the route is first seen.
    let labels: String
    /// A handful of statuses per route: a short array beats a dictionary here.
    var statuses: [(status: Int, count: UInt64)] = []
    var latency = MetricsHistogram(buckets: Metrics.httpBounds.count)

    init(label: String) {
        self.label = label
        let parts = label.split(separator: " ", maxSplits: 1)
        let (method, route) = parts.count == 2 ? (String(parts[0]), String(parts[1])) : ("-", label)
        labels = "method=\"\(prometheusEscaped(method))\",route=\"\(prometheusEscaped(route))\""
    }

    mutating func count(_ status: Int) {
        for i in statuses.indices where statuses[i].status == status {
            statuses[i].count &+= 1
            return
        }
        statuses.append((status, 1))
    }
}

struct MetricsHTTPSide: Sendable {
    var index: [String: Int] = [:]
    var series: [MetricsRouteSeries] = []
}

extension OperationState {
    /// Position in `allCases`, for the per-state counter arrays.
    var metricsIndex: Int {
        switch self {
        case .pending: 0
        case .ready: 1
        case .executing: 2
        case .paused: 3
        case .finished: 4
        }
    }
}

// MARK: - the text format

/// A label value escaped for the text format: backslash, double quote and line feed.
func prometheusEscaped(_ value: String) -> String {
    guard value.utf8.contains(where: { $0 == 0x5C || $0 == 0x22 || $0 == 0x0A }) else { return value }
    var out = ""
    out.reserveCapacity(value.utf8.count + 8)
    for c in value.unicodeScalars {
        switch c {
        case "\\": out += "\\\\"
        case "\"": out += "\\\""
        case "\n": out += "\\n"
        default: out.unicodeScalars.append(c)
        }
    }
    return out
}

/// A sample value as the text format writes it (`+Inf`, `-Inf`, `NaN` for the special ones).
func prometheusNumber(_ value: Double) -> String {
    if value.isNaN { return "NaN" }
    if value.isInfinite { return value > 0 ? "+Inf" : "-Inf" }
    if value == value.rounded(), abs(value) < 1e15 { return String(Int64(value)) }
    return "\(value)"
}

/// Prometheus text exposition, family by family.
package struct Exposition {
    package enum Kind: String {
        case counter, gauge, histogram
    }
    private var text = ""

    package init(capacity: Int = 64 * 1024) { text.reserveCapacity(capacity) }

    package var bytes: [UInt8] { Array(text.utf8) }

    package mutating func family(_ name: String, _ kind: Kind, _ help: String) {
        // HELP text escapes backslash and line feed.
        let h = help.replacingBackslashesAndNewlines()
        text += "# HELP \(name) \(h)\n# TYPE \(name) \(kind.rawValue)\n"
    }

    package mutating func sample(_ name: String, _ labels: String, _ value: some BinaryInteger) {
        text += labels.isEmpty ? "\(name) \(value)\n" : "\(name){\(labels)} \(value)\n"
    }

    mutating func sample(_ name: String, _ labels: String, _ value: Double) {
        text += labels.isEmpty ? "\(name) \(prometheusNumber(value))\n" : "\(name){\(labels)} \(prometheusNumber(value))\n"
    }

    /// `_bucket` lines (cumulative, ending with `+Inf` equal to `_count`), `_sum`, `_count`.
    mutating func histogram(_ name: String, _ labels: String, _ bounds: [Double], _ h: MetricsHistogram) {
        histogram(name, labels, bounds: bounds, counts: h.counts, sum: h.sum, count: h.count)
    }

    mutating func histogram(_ name: String, _ labels: String, _ h: StoreHistogram) {
        histogram(name, labels, bounds: h.bounds, counts: h.counts, sum: h.sum, count: h.count)
    }

    private mutating func histogram(_ name: String, _ labels: String, bounds: [Double], counts: [UInt64], sum: Double, count: UInt64) {
        let prefix = labels.isEmpty ? "" : labels + ","
        var cumulative: UInt64 = 0
        for (i, bound) in bounds.enumerated() where i < counts.count {
            cumulative &+= counts[i]
            text += "\(name)_bucket{\(prefix)le=\"\(prometheusNumber(bound))\"} \(cumulative)\n"
        }
        text += "\(name)_bucket{\(prefix)le=\"+Inf\"} \(count)\n"
        let braces = labels.isEmpty ? "" : "{\(labels)}"
        text += "\(name)_sum\(braces) \(prometheusNumber(sum))\n\(name)_count\(braces) \(count)\n"
    }
}

extension String {
    fileprivate func replacingBackslashesAndNewlines() -> String {
        guard utf8.contains(where: { $0 == 0x5C || $0 == 0x0A }) else { return self }
        var out = ""
        for c in unicodeScalars {
            switch c {
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            default: out.unicodeScalars.append(c)
            }
        }
        return out
    }
}

// MARK: - process

/// The process's own numbers from `/proc/self` (Linux; nil elsewhere or when unreadable).
enum ProcessStats {
    struct Sample {
        var cpuSeconds: Double?
        var residentBytes: Int?
        var virtualBytes: Int?
        var openFDs: Int?
    }

    static func read() -> Sample {
        var s = Sample()
        let page = Int(sysconf(Int32(_SC_PAGESIZE)))
        if let statm = readSmallFile("/proc/self/statm") {
            let fields = statm.split(separator: " ")
            if fields.count >= 2, let pages = Int(fields[1]), let total = Int(fields[0]) {
                s.residentBytes = pages.multipliedReportingOverflow(by: page).overflow ? nil : pages * page
                s.virtualBytes = total.multipliedReportingOverflow(by: page).overflow ? nil : total * page
            }
        }
        if let fields = statFields(), fields.count > 12, let user = Double(fields[11]), let system = Double(fields[12]) {
            let ticks = Double(sysconf(Int32(_SC_CLK_TCK)))
            if ticks > 0 { s.cpuSeconds = (user + system) / ticks }
        }
        if let dir = opendir("/proc/self/fd") {
            var n = 0
            while let entry = readdir(dir) {
                if entry.pointee.d_name.0 != 0x2E { n += 1 }  // not "." or ".."
            }
            closedir(dir)
            s.openFDs = max(0, n - 1)  // less the descriptor opendir itself holds
        }
        return s
    }

    /// Seconds since the epoch when the process started: its start in clock ticks after boot
    /// (`/proc/self/stat`) plus the boot time (`btime` in `/proc/stat`).
    static func startTime() -> Double? {
        guard let fields = statFields(), fields.count > 19, let ticks = Double(fields[19]),
            let stat = readSmallFile("/proc/stat", limit: 1 << 20),
            let line = stat.split(separator: "\n").first(where: { $0.hasPrefix("btime ") }),
            let boot = Double(line.dropFirst(6).trimmingPrefix(" "))
        else { return nil }
        let hz = Double(sysconf(Int32(_SC_CLK_TCK)))
        return hz > 0 ? boot + ticks / hz : nil
    }

    static func now() -> Double {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
    }

    /// The fields of `/proc/self/stat` after the command name (which may hold spaces):
    /// index 0 is the state (field 3 of proc(5)).
    private static func statFields() -> [Substring]? {
        guard let stat = readSmallFile("/proc/self/stat"), let close = stat.lastIndex(of: ")") else { return nil }
        return stat[stat.index(after: close)...].split(separator: " ")
    }

    /// A file of `/proc` (whose size `stat` does not tell), up to `limit` bytes.
    private static func readSmallFile(_ path: String, limit: Int = 4096) -> String? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var buffer = [UInt8](repeating: 0, count: min(4096, limit))
        var length = 0
        while true {
            if length == buffer.count {
                guard buffer.count < limit else { break }
                buffer.append(contentsOf: repeatElement(0, count: min(buffer.count, limit - buffer.count)))
            }
            let n = buffer.withUnsafeMutableBytes { raw in
                raw.baseAddress.map { Glibc.read(fd, $0 + length, raw.count - length) } ?? 0
            }
            if n <= 0 { break }
            length += n
        }
        return String(decoding: buffer[..<length], as: UTF8.self)
    }
}
