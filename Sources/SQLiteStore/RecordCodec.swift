import QueueEngine
import StoreKit

/// Binds snapshots and events to the writer's statements, straight from their fields.
/// Every text and JSON column of a row is written into one reused buffer and bound without a
/// copy (`TextRow`): no Foundation, no intermediate `String`, no allocation per column.
struct RecordBinder {
    private var row = TextRow()

    mutating func write(_ s: OperationSnapshot, with st: SQLiteStatement) throws(SQLiteFailure) {
        row.reset()
        st.bind(1, s.id.raw)
        row.add(2, s.queue)
        if let name = s.name { row.add(3, name) } else { st.bindNull(3) }
        row.add(4, s.kind)
        addJSON(s.spec, 5, st)
        st.bind(6, s.queuePriority.rawValue)
        row.add(7, s.state.rawValue)
        if let o = s.outcome { row.add(8, o.rawValue) } else { st.bindNull(8) }
        st.bind(9, s.isCancelled)
        row.add(10) { out in
            out.append(UInt8(ascii: "["))
            for (i, d) in s.dependencies.enumerated() {
                if i > 0 { out.append(UInt8(ascii: ",")) }
                JSONWriter.integer(d.raw, to: &out)
            }
            out.append(UInt8(ascii: "]"))
        }
        if let p = s.progress { st.bind(11, p.completed); st.bind(12, p.total) } else { st.bindNull(11); st.bindNull(12) }
        st.bind(13, s.attempt)
        addJSON(s.result, 14, st)
        addJSON(s.error, 15, st)
        st.bind(16, s.createdAt.nanoseconds)
        bindTime(s.startedAt, 17, st)
        bindTime(s.finishedAt, 18, st)
        st.bind(19, s.revision)
        if let t = s.options.timeout { st.bind(20, t) } else { st.bindNull(20) }
        if let r = s.options.retry {
            row.add(21) { out in
                out.append(contentsOf: #"{"maxAttempts":"#.utf8)
                JSONWriter.integer(r.maxAttempts, to: &out)
                out.append(contentsOf: #","backoff":"#.utf8)
                JSONWriter.number(r.backoff, to: &out)
                out.append(contentsOf: #","multiplier":"#.utf8)
                JSONWriter.number(r.multiplier, to: &out)
                out.append(UInt8(ascii: "}"))
            }
        } else {
            st.bindNull(21)
        }
        bindTime(s.options.notBefore, 22, st)
        st.bind(23, s.executedSeconds)
        addJSON(s.kindState, 24, st)
        bindTime(s.cascadeAt, 25, st)
        // Most operations name no limiter: NULL, with nothing written.
        if s.options.limits.isEmpty {
            st.bindNull(26)
        } else {
            row.add(26) { FlowText.writeLimits(s.options.limits, to: &$0) }
        }
        if let f = s.options.fairnessKey { row.add(27, f) } else { st.bindNull(27) }
        if let tag = s.schedule {
            row.add(28, tag.name)
            st.bind(29, tag.nominalTime.nanoseconds)
        } else {
            st.bindNull(28)
            st.bindNull(29)
        }
        if let a = s.admission { row.add(30, a.text) } else { st.bindNull(30) }
        try st.run(binding: row)
    }

    mutating func write(_ s: ScheduleSnapshot, with st: SQLiteStatement) throws(SQLiteFailure) {
        row.reset()
        row.add(1, s.queue)
        row.add(2, s.spec.name)
        let settings = ScheduleText.write(s.spec)
        row.add(3) { $0.append(contentsOf: settings) }
        st.bind(4, s.createdAt.nanoseconds)
        st.bind(5, s.revision)
        st.bind(6, s.isPaused)
        if let n = s.pausedNote { row.add(7, n) } else { st.bindNull(7) }
        bindTime(s.lastNominal, 8, st)
        bindTime(s.lastRun?.nominalTime, 9, st)
        if let r = s.lastRun { st.bind(10, r.operation.raw) } else { st.bindNull(10) }
        st.bind(11, s.runs)
        st.bind(12, s.skipped)
        st.bind(13, s.missed)
        try st.run(binding: row)
    }

    mutating func write(_ q: QueueSnapshot, with st: SQLiteStatement) throws(SQLiteFailure) {
        row.reset()
        row.add(1, q.name)
        st.bind(2, q.maxConcurrentOperationCount)
        st.bind(3, q.effectiveMaxConcurrentOperationCount)
        st.bind(4, q.isSuspended)
        st.bind(5, q.revision)
        st.bind(6, q.createdAt.nanoseconds)
        bindRate(q.rateLimit, 7, st)
        if q.fairnessWeights.isEmpty {
            st.bindNull(9)
        } else {
            row.add(9) { FlowText.writeWeights(q.fairnessWeights, to: &$0) }
        }
        try st.run(binding: row)
    }

    /// `running`, `waiting` and `keys` are counted again by the engine: not stored.
    mutating func write(_ l: LimiterSnapshot, with st: SQLiteStatement) throws(SQLiteFailure) {
        row.reset()
        row.add(1, l.name)
        if let c = l.settings.concurrency { st.bind(2, c) } else { st.bindNull(2) }
        bindRate(l.settings.rate, 3, st)
        if l.settings.overrides.isEmpty {
            st.bindNull(5)
        } else {
            row.add(5) { FlowText.writeOverrides(l.settings.overrides, to: &$0) }
        }
        st.bind(6, l.createdAt.nanoseconds)
        st.bind(7, l.revision)
        try st.run(binding: row)
    }

    mutating func write(_ h: HostSnapshot, with st: SQLiteStatement) throws(SQLiteFailure) {
        row.reset()
        row.add(1, h.host)
        row.add(2, h.state.rawValue)
        st.bind(3, h.consecutiveFailures)
        bindTime(h.openedAt, 4, st)
        bindTime(h.until, 5, st)
        bindTime(h.throttledUntil, 6, st)
        addJSON(h.lastError, 7, st)
        if let m = h.manual {
            row.add(8, m.breaker.rawValue)
            bindTime(m.until, 9, st)
            if let r = m.reason { row.add(10, r) } else { st.bindNull(10) }
        } else {
            st.bindNull(8)
            st.bindNull(9)
            st.bindNull(10)
        }
        st.bind(11, h.reopenings)
        st.bind(12, h.revision)
        try st.run(binding: row)
    }

    /// A rate in columns `i` (per second) and `i + 1` (burst); NULL in both for none.
    private func bindRate(_ r: RateLimit?, _ i: Int32, _ st: SQLiteStatement) {
        if let r {
            st.bind(i, r.perSecond)
            st.bind(i + 1, r.burst)
        } else {
            st.bindNull(i)
            st.bindNull(i + 1)
        }
    }

    mutating func write(_ e: ChangeEvent, with st: SQLiteStatement) throws(SQLiteFailure) {
        row.reset()
        st.bind(1, e.seq)
        st.bind(2, e.time.nanoseconds)
        row.add(3, e.queue)
        st.bind(4, e.operation.raw)
        row.add(5, e.key.rawValue)
        addChange(e.old, 6, st)
        addChange(e.new, 7, st)
        row.add(8, e.state.rawValue)
        try st.run(binding: row)
    }

    mutating func write(_ r: IdempotencyRecord, with st: SQLiteStatement) throws(SQLiteFailure) {
        row.reset()
        row.add(1, r.scope)
        row.add(2, r.bodyHash)
        st.bind(3, r.status)
        row.add(4) { out in
            out.append(UInt8(ascii: "["))
            for (i, (name, value)) in r.headers.enumerated() {
                if i > 0 { out.append(UInt8(ascii: ",")) }
                out.append(UInt8(ascii: "["))
                JSONWriter.string(name, to: &out)
                out.append(UInt8(ascii: ","))
                JSONWriter.string(value, to: &out)
                out.append(UInt8(ascii: "]"))
            }
            out.append(UInt8(ascii: "]"))
        }
        st.bind(5, blob: r.body)
        st.bind(6, r.createdAt.nanoseconds)
        try st.run(binding: row)
    }

    private mutating func addJSON(_ v: JSONValue?, _ i: Int32, _ st: SQLiteStatement) {
        guard let v else { st.bindNull(i); return }
        row.add(i) { v.write(to: &$0) }
    }

    private func bindTime(_ t: Timestamp?, _ i: Int32, _ st: SQLiteStatement) {
        if let t { st.bind(i, t.nanoseconds) } else { st.bindNull(i) }
    }

    /// `none` is NULL; the other cases have distinct JSON types, so reading needs no tag:
    /// boolean, integer, string (a priority name), object (`{"completed","total"}`).
    private mutating func addChange(_ v: ChangeValue, _ i: Int32, _ st: SQLiteStatement) {
        switch v {
        case .none: st.bindNull(i)
        case let .bool(b): row.add(i, b ? "true" : "false")
        case let .int(n): row.add(i) { JSONWriter.integer(n, to: &$0) }
        case let .priority(p): row.add(i) { JSONWriter.string(p.name, to: &$0) }
        case let .breaker(b): row.add(i) { JSONWriter.string(b.rawValue, to: &$0) }
        case let .progress(p):
            row.add(i) { out in
                out.append(contentsOf: #"{"completed":"#.utf8)
                JSONWriter.number(p.completed, to: &out)
                out.append(contentsOf: #","total":"#.utf8)
                JSONWriter.number(p.total, to: &out)
                out.append(UInt8(ascii: "}"))
            }
        }
    }
}

/// Reads rows back into values. Every failure names the row and column.
package enum RecordDecoder {
    static func operation(_ st: SQLiteStatement) throws(DecodeFailure) -> OperationSnapshot {
        let raw = st.uint64(0)
        func fail(_ column: String, _ why: String) -> DecodeFailure {
            DecodeFailure(detail: "operations row \(OperationID(raw: raw)): column \(column) \(why)")
        }
        // Values the engine could never have written are refused here, naming the row, so a
        // damaged or hand-edited file fails the start instead of trapping in arithmetic later.
        guard raw > 0, raw <= RecordLimits.maxID else { throw fail("id", "is not an operation id") }
        guard let queue = st.text(1) else { throw fail("queue", "is NULL") }
        guard let kind = st.text(3) else { throw fail("kind", "is NULL") }
        guard let priority = QueuePriority(rawValue: st.int(5)) else { throw fail("priority", "is not a priority") }
        guard let stateText = st.text(6), let state = OperationState(rawValue: stateText) else { throw fail("state", "is not a state") }
        var outcome: OperationOutcome?
        if let o = st.text(7) {
            guard let v = OperationOutcome(rawValue: o) else { throw fail("outcome", "is not an outcome") }
            outcome = v
        }
        guard let deps = st.withBytes(9, { parseIDList($0) }), let dependencies = deps else { throw fail("dependencies", "is not a list of ids") }
        let progress = st.isNull(10) ? nil : OperationProgress(completed: st.double(10), total: st.double(11))
        var retry: RetryPolicy?
        if let r = try json(st, 20, fail("retry", "is not JSON")) {
            guard case let .number(m)? = r["maxAttempts"], case let .number(b)? = r["backoff"], case let .number(x)? = r["multiplier"] else {
                throw fail("retry", "lacks maxAttempts, backoff or multiplier")
            }
            guard m == m.rounded(), m >= 1, m <= Double(RecordLimits.maxAttempt) else { throw fail("retry", "has maxAttempts \(m)") }
            guard b.isFinite, b >= 0, x.isFinite, x >= 0 else { throw fail("retry", "has backoff \(b), multiplier \(x)") }
            retry = RetryPolicy(maxAttempts: Int(m), backoff: b, multiplier: x)
        }
        var timeout: Double?
        if !st.isNull(19) {
            let t = st.double(19)
            guard t.isFinite, t >= 0 else { throw fail("timeout", "is \(t)") }
            timeout = t
        }
        let attempt = st.int(12)
        guard (0...RecordLimits.maxAttempt).contains(attempt) else { throw fail("attempt", "is \(attempt)") }
        let revision = st.uint64(18)
        guard revision <= RecordLimits.maxCounter else { throw fail("revision", "is \(revision)") }
        let executed = st.double(22)
        guard executed.isFinite, executed >= 0 else { throw fail("executed_seconds", "is \(executed)") }
        let limits: [LimitRef]
        do throws(FlowText.Refusal) { limits = try FlowText.limits(st.bytes(25)) } catch { throw fail("limits", error.why) }
        let fairnessKey: String?
        do throws(FlowText.Refusal) { fairnessKey = try FlowText.fairnessKey(st.text(26)) } catch { throw fail("fairness_key", error.why) }
        let options = OperationOptions(timeout: timeout, retry: retry, notBefore: time(st, 21), limits: limits, fairnessKey: fairnessKey)
        return OperationSnapshot(
            id: OperationID(raw: raw), queue: queue, name: st.text(2), kind: kind,
            spec: try json(st, 4, fail("spec", "is not JSON")),
            state: state, outcome: outcome, isCancelled: st.int64(8) != 0, queuePriority: priority,
            dependencies: dependencies, progress: progress, attempt: attempt,
            result: try json(st, 13, fail("result", "is not JSON")),
            error: try json(st, 14, fail("error", "is not JSON")),
            createdAt: Timestamp(nanoseconds: st.int64(15)), startedAt: time(st, 16), finishedAt: time(st, 17),
            revision: revision, options: options, executedSeconds: executed,
            kindState: try json(st, 23, fail("kind_state", "is not JSON")), cascadeAt: time(st, 24),
            schedule: try scheduleTag(st, 27, fail),
            admission: try admissionTag(st.text(29), fail))
    }

    private static func admissionTag(_ text: String?, _ fail: (String, String) -> DecodeFailure) throws(DecodeFailure) -> AdmissionTag? {
        guard let text else { return nil }
        guard let tag = AdmissionTag(text: text) else { throw fail("admission", "is not `debounce <ns> <key>` or `singleton <key>`") }
        return tag
    }

    private static func scheduleTag(_ st: SQLiteStatement, _ i: Int32, _ fail: (String, String) -> DecodeFailure) throws(DecodeFailure) -> ScheduleTag? {
        switch (st.text(i), optionalInt(st, i + 1)) {
        case (nil, nil): return nil
        case let (name?, nominal?):
            guard FlowText.isName(name) else { throw fail("schedule_name", "is not a schedule name") }
            return ScheduleTag(name: name, nominalTime: Timestamp(nanoseconds: nominal))
        default: throw fail("schedule_name", "and schedule_nominal are not both set or both NULL")
        }
    }

    static func history(_ st: SQLiteStatement) throws(DecodeFailure) -> HistoryRow {
        try HistoryText.row(queue: st.text(0) ?? "", step: st.int64(1), start: st.int64(2), data: st.text(3)).get()
    }

    static func schedule(_ st: SQLiteStatement) throws(DecodeFailure) -> ScheduleSnapshot {
        let queue = st.text(0) ?? ""
        let name = st.text(1) ?? ""
        func fail(_ column: String, _ why: String) -> DecodeFailure {
            DecodeFailure(detail: "schedules row \(queue.debugDescription)/\(name.debugDescription): column \(column) \(why)")
        }
        guard FlowText.isName(name) else { throw fail("name", "is not a schedule name") }
        let spec: ScheduleSpec
        do throws(ScheduleText.Refusal) { spec = try ScheduleText.read(name: name, st.bytes(2)) } catch { throw fail("settings", error.why) }
        let revision = st.uint64(4)
        guard revision <= RecordLimits.maxCounter else { throw fail("revision", "is \(revision)") }
        var s = ScheduleSnapshot(queue: queue, spec: spec, createdAt: Timestamp(nanoseconds: st.int64(3)), revision: revision, isPaused: st.int64(5) != 0)
        s.pausedNote = st.text(6)
        s.lastNominal = optionalInt(st, 7).map(Timestamp.init(nanoseconds:))
        switch (optionalInt(st, 8), optionalInt(st, 9)) {
        case (nil, nil): break
        case let (n?, op?):
            guard op > 0 else { throw fail("last_run_operation", "is \(op)") }
            s.lastRun = (Timestamp(nanoseconds: n), OperationID(raw: UInt64(op)))
        default: throw fail("last_run_nominal", "and last_run_operation are not both set or both NULL")
        }
        for (i, column) in [(Int32(10), "runs"), (11, "skipped"), (12, "missed")] {
            guard st.int64(i) >= 0 else { throw fail(column, "is negative") }
        }
        s.runs = st.uint64(10)
        s.skipped = st.uint64(11)
        s.missed = st.uint64(12)
        return s
    }

    /// Counts and `operationCount` are not stored (they change with every operation); the
    /// loader fills them in from the operations.
    static func queue(_ st: SQLiteStatement) throws(DecodeFailure) -> QueueSnapshot {
        guard let name = st.text(0) else { throw DecodeFailure(detail: "queues row with a NULL name") }
        let maxConcurrent = st.int(1), revision = st.uint64(4)
        guard maxConcurrent == -1 || (1...Int(Int32.max)).contains(maxConcurrent) else {
            throw DecodeFailure(detail: "queues row \(name): column max_concurrent is \(maxConcurrent)")
        }
        guard revision <= RecordLimits.maxCounter else { throw DecodeFailure(detail: "queues row \(name): column revision is \(revision)") }
        let rate: RateLimit?
        do throws(FlowText.Refusal) { rate = try FlowText.rate(perSecond: optionalDouble(st, 6), burst: optionalInt(st, 7)) } catch {
            throw DecodeFailure(detail: "queues row \(name): column \(error.rateColumn) \(error.why)")
        }
        let weights: [String: Int]
        do throws(FlowText.Refusal) { weights = try FlowText.weights(st.bytes(8)) } catch {
            throw DecodeFailure(detail: "queues row \(name): column fairness_weights \(error.why)")
        }
        var counts: [OperationState: Int] = [:]
        for s in OperationState.allCases { counts[s] = 0 }
        return QueueSnapshot(
            name: name, maxConcurrentOperationCount: maxConcurrent, effectiveMaxConcurrentOperationCount: st.int(2),
            isSuspended: st.int64(3) != 0, operationCount: 0, counts: counts, revision: revision,
            createdAt: Timestamp(nanoseconds: st.int64(5)), rateLimit: rate, fairnessWeights: weights)
    }

    /// Its settings; `running`, `waiting` and `keys` are the engine's to count (0 here).
    static func limiter(_ st: SQLiteStatement) throws(DecodeFailure) -> LimiterSnapshot {
        guard let name = st.text(0) else { throw DecodeFailure(detail: "limiters row with a NULL name") }
        func fail(_ column: String, _ why: String) -> DecodeFailure {
            DecodeFailure(detail: "limiters row \(name.debugDescription): column \(column) \(why)")
        }
        guard FlowText.isName(name) else { throw fail("name", "is not a limiter name") }
        var settings = LimiterSettings()
        do throws(FlowText.Refusal) { settings.concurrency = try FlowText.concurrency(optionalInt(st, 1)) } catch { throw fail("concurrency", error.why) }
        do throws(FlowText.Refusal) { settings.rate = try FlowText.rate(perSecond: optionalDouble(st, 2), burst: optionalInt(st, 3)) } catch {
            throw fail(error.rateColumn, error.why)
        }
        guard settings.concurrency != nil || settings.rate != nil else { throw fail("concurrency", "and the rate are both NULL") }
        do throws(FlowText.Refusal) { settings.overrides = try FlowText.overrides(st.bytes(4)) } catch { throw fail("overrides", error.why) }
        let revision = st.uint64(6)
        guard revision <= RecordLimits.maxCounter else { throw fail("revision", "is \(revision)") }
        return LimiterSnapshot(name: name, settings: settings, createdAt: Timestamp(nanoseconds: st.int64(5)), revision: revision)
    }

    static func host(_ st: SQLiteStatement) throws(DecodeFailure) -> HostSnapshot {
        let name = st.text(0)
        let row = HostText.Row(
            host: name, state: st.text(1), consecutiveFailures: st.int64(2), openedAt: optionalInt(st, 3), until: optionalInt(st, 4),
            throttledUntil: optionalInt(st, 5), lastError: st.isNull(6) ? nil : st.bytes(6), manualBreaker: st.text(7),
            manualUntil: optionalInt(st, 8), manualReason: st.text(9), reopenings: st.int64(10), revision: st.int64(11))
        do throws(HostText.Refusal) { return try HostText.decode(row) } catch {
            throw DecodeFailure(detail: "hosts row \((name ?? "NULL").debugDescription): column \(error.column) \(error.why)")
        }
    }

    private static func optionalDouble(_ st: SQLiteStatement, _ i: Int32) -> Double? { st.isNull(i) ? nil : st.double(i) }
    private static func optionalInt(_ st: SQLiteStatement, _ i: Int32) -> Int64? { st.isNull(i) ? nil : st.int64(i) }

    static func event(_ st: SQLiteStatement) throws(DecodeFailure) -> ChangeEvent {
        let seq = st.uint64(0)
        func fail(_ column: String) -> DecodeFailure { DecodeFailure(detail: "events row \(seq): column \(column) is not valid") }
        guard seq > 0, seq <= RecordLimits.maxCounter else { throw fail("seq") }
        guard let queue = st.text(2) else { throw fail("queue") }
        guard let k = st.text(4), let key = ChangeKey(rawValue: k) else { throw fail("key") }
        guard let old = changeColumn(st, 5) else { throw fail("old") }
        guard let new = changeColumn(st, 6) else { throw fail("new") }
        guard let s = st.text(7), let state = OperationState(rawValue: s) else { throw fail("state") }
        return ChangeEvent(
            seq: seq, time: Timestamp(nanoseconds: st.int64(1)), queue: queue, operation: OperationID(raw: st.uint64(3)),
            key: key, old: old, new: new, state: state)
    }

    static func idempotency(_ st: SQLiteStatement) throws(DecodeFailure) -> IdempotencyRecord {
        guard let scope = st.text(0) else { throw DecodeFailure(detail: "idempotency row with a NULL scope") }
        func fail() -> DecodeFailure { DecodeFailure(detail: "idempotency row \(scope): column headers is not valid") }
        var headers: [(String, String)] = []
        guard let h = try json(st, 3, fail()), case let .array(pairs) = h else { throw fail() }
        for p in pairs {
            guard case let .array(nv) = p, nv.count == 2, case let .string(n) = nv[0], case let .string(v) = nv[1] else { throw fail() }
            headers.append((n, v))
        }
        return IdempotencyRecord(
            scope: scope, bodyHash: st.text(1) ?? "", status: st.int(2), headers: headers,
            body: st.bytes(4) ?? [], createdAt: Timestamp(nanoseconds: st.int64(5)))
    }

    private static func time(_ st: SQLiteStatement, _ i: Int32) -> Timestamp? {
        st.isNull(i) ? nil : Timestamp(nanoseconds: st.int64(i))
    }

    private static func json(_ st: SQLiteStatement, _ i: Int32, _ failure: @autoclosure () -> DecodeFailure) throws(DecodeFailure) -> JSONValue? {
        guard let bytes = st.bytes(i) else { return nil }
        do { return try JSONValue.parse(bytes) } catch { throw failure() }
    }

    /// `[1,22,333]` (ids as exact integers: JSON numbers are doubles, ids are 64-bit).
    static func parseIDList(_ b: UnsafeRawBufferPointer) -> [OperationID]? {
        var out: [OperationID] = []
        var i = 0
        func skip() { while i < b.count, b[i] == 0x20 { i += 1 } }
        skip()
        guard i < b.count, b[i] == UInt8(ascii: "[") else { return nil }
        i += 1; skip()
        if i < b.count, b[i] == UInt8(ascii: "]") { return out }
        while true {
            skip()
            var v: UInt64 = 0
            let start = i
            while i < b.count, b[i] >= 48, b[i] <= 57 {
                let (m, o1) = v.multipliedReportingOverflow(by: 10)
                let (a, o2) = m.addingReportingOverflow(UInt64(b[i] - 48))
                if o1 || o2 { return nil }
                v = a; i += 1
            }
            if i == start { return nil }
            out.append(OperationID(raw: v))
            skip()
            guard i < b.count else { return nil }
            if b[i] == UInt8(ascii: ",") { i += 1; continue }
            if b[i] == UInt8(ascii: "]") { return out }
            return nil
        }
    }

    private static func changeColumn(_ st: SQLiteStatement, _ i: Int32) -> ChangeValue? {
        if st.isNull(i) { return ChangeValue.none }
        return st.withBytes(i) { ChangeText.decode($0) } ?? nil
    }
}
