import QueueEngine
import StoreKit

/// Reads rows back into values, with the SQLite store's checks: a value opqd could never have
/// written (a database edited by hand, or by something else) fails naming the row and column,
/// instead of trapping in arithmetic later. Column order is that of `PGSchema`'s column lists.
enum PGRecordDecoder {
    static func operation(_ r: PGResult, _ row: Int) throws(DecodeFailure) -> OperationSnapshot {
        let id = r.int64(row, 0)
        func fail(_ column: String, _ why: String) -> DecodeFailure {
            DecodeFailure(detail: "operations row \(id.map { String($0) } ?? "?"): column \(column) \(why)")
        }
        guard let id, let raw = UInt64(exactly: id), raw > 0, raw <= RecordLimits.maxID else { throw fail("id", "is not an operation id") }
        guard let queue = r.text(row, 1) else { throw fail("queue", "is NULL") }
        var name: String?
        if !r.isNull(row, 2) {
            guard let b = r.bytea(row, 2) else { throw fail("name", "is not bytea") }
            name = String(decoding: b, as: UTF8.self)
        }
        guard let kind = r.text(row, 3) else { throw fail("kind", "is NULL") }
        guard let p = r.int64(row, 5), let pi = Int(exactly: p), let priority = QueuePriority(rawValue: pi) else { throw fail("priority", "is not a priority") }
        guard let stateText = r.text(row, 6), let state = OperationState(rawValue: stateText) else { throw fail("state", "is not a state") }
        var outcome: OperationOutcome?
        if let o = r.text(row, 7) {
            guard let v = OperationOutcome(rawValue: o) else { throw fail("outcome", "is not an outcome") }
            outcome = v
        }
        guard let cancelled = r.bool(row, 8) else { throw fail("is_cancelled", "is not a boolean") }
        guard let dependencies = r.withBytes(row, 9, { idArray($0) }) ?? nil else { throw fail("dependencies", "is not an array of ids") }
        var progress: OperationProgress?
        if !r.isNull(row, 10) {
            guard let c = r.double(row, 10), let t = r.double(row, 11) else { throw fail("progress", "is not two numbers") }
            progress = OperationProgress(completed: c, total: t)
        }
        guard let a = r.int64(row, 12), let attempt = Int(exactly: a), (0...RecordLimits.maxAttempt).contains(attempt) else {
            throw fail("attempt", "is \(r.text(row, 12) ?? "NULL")")
        }
        var retry: RetryPolicy?
        if let v = try json(r, row, 20, fail("retry", "is not JSON")) {
            guard case let .number(m)? = v["maxAttempts"], case let .number(b)? = v["backoff"], case let .number(x)? = v["multiplier"] else {
                throw fail("retry", "lacks maxAttempts, backoff or multiplier")
            }
            guard m == m.rounded(), m >= 1, m <= Double(RecordLimits.maxAttempt), let maxAttempts = Int(exactly: m) else {
                throw fail("retry", "has maxAttempts \(m)")
            }
            guard b.isFinite, b >= 0, x.isFinite, x >= 0 else { throw fail("retry", "has backoff \(b), multiplier \(x)") }
            retry = RetryPolicy(maxAttempts: maxAttempts, backoff: b, multiplier: x)
        }
        var timeout: Double?
        if !r.isNull(row, 19) {
            guard let t = r.double(row, 19), t.isFinite, t >= 0 else { throw fail("timeout", "is \(r.text(row, 19) ?? "")") }
            timeout = t
        }
        guard let rv = r.int64(row, 18), let revision = UInt64(exactly: rv), revision <= RecordLimits.maxCounter else {
            throw fail("revision", "is \(r.text(row, 18) ?? "NULL")")
        }
        guard let executed = r.double(row, 22), executed.isFinite, executed >= 0 else { throw fail("executed_seconds", "is \(r.text(row, 22) ?? "NULL")") }
        guard let created = r.int64(row, 15) else { throw fail("created_at", "is not a time") }
        let limits: [LimitRef]
        do throws(FlowText.Refusal) { limits = try FlowText.limits(r.withBytes(row, 25) { Array($0) }) } catch { throw fail("limits", error.why) }
        var fairnessKey: String?
        if !r.isNull(row, 26) {
            guard let b = r.bytea(row, 26) else { throw fail("fairness_key", "is not bytea") }
            do throws(FlowText.Refusal) { fairnessKey = try FlowText.fairnessKey(String(decoding: b, as: UTF8.self)) } catch {
                throw fail("fairness_key", error.why)
            }
        }
        let options = OperationOptions(
            timeout: timeout, retry: retry, notBefore: try time(r, row, 21, fail("not_before", "is not a time")), limits: limits,
            fairnessKey: fairnessKey)
        return OperationSnapshot(
            id: OperationID(raw: raw), queue: queue, name: name, kind: kind,
            spec: try json(r, row, 4, fail("spec", "is not JSON")),
            state: state, outcome: outcome, isCancelled: cancelled, queuePriority: priority,
            dependencies: dependencies, progress: progress, attempt: attempt,
            result: try json(r, row, 13, fail("result", "is not JSON")),
            error: try json(r, row, 14, fail("error", "is not JSON")),
            createdAt: Timestamp(nanoseconds: created),
            startedAt: try time(r, row, 16, fail("started_at", "is not a time")),
            finishedAt: try time(r, row, 17, fail("finished_at", "is not a time")),
            revision: revision, options: options, executedSeconds: executed,
            kindState: try json(r, row, 23, fail("kind_state", "is not JSON")),
            cascadeAt: try time(r, row, 24, fail("cascade_at", "is not a time")),
            schedule: try scheduleTag(r, row, fail),
            admission: try admissionTag(r, row, fail))
    }

    private static func admissionTag(_ r: PGResult, _ row: Int, _ fail: (String, String) -> DecodeFailure) throws(DecodeFailure) -> AdmissionTag? {
        guard !r.isNull(row, 29) else { return nil }
        guard let text = r.text(row, 29), let tag = AdmissionTag(text: text) else {
            throw fail("admission", "is not `debounce <ns> <key>` or `singleton <key>`")
        }
        return tag
    }

    private static func scheduleTag(_ r: PGResult, _ row: Int, _ fail: (String, String) -> DecodeFailure) throws(DecodeFailure) -> ScheduleTag? {
        switch (r.isNull(row, 27), r.isNull(row, 28)) {
        case (true, true): return nil
        case (false, false):
            guard let name = r.text(row, 27), FlowText.isName(name), let n = r.int64(row, 28) else { throw fail("schedule_name", "is not a schedule run") }
            return ScheduleTag(name: name, nominalTime: Timestamp(nanoseconds: n))
        default: throw fail("schedule_name", "and schedule_nominal are not both set or both NULL")
        }
    }

    static func schedule(_ r: PGResult, _ row: Int) throws(DecodeFailure) -> ScheduleSnapshot {
        let queue = r.text(row, 0) ?? ""
        let name = r.text(row, 1) ?? ""
        func fail(_ column: String, _ why: String) -> DecodeFailure {
            DecodeFailure(detail: "schedules row \(queue.debugDescription)/\(name.debugDescription): column \(column) \(why)")
        }
        guard FlowText.isName(name) else { throw fail("name", "is not a schedule name") }
        let spec: ScheduleSpec
        do throws(ScheduleText.Refusal) { spec = try ScheduleText.read(name: name, r.withBytes(row, 2) { Array($0) }) } catch {
            throw fail("settings", error.why)
        }
        func int(_ c: Int) -> Int64? { r.isNull(row, c) ? nil : r.int64(row, c) }
        guard let created = int(3), let rev = int(4), rev >= 0 else { throw fail("revision", "is not valid") }
        var s = ScheduleSnapshot(
            queue: queue, spec: spec, createdAt: Timestamp(nanoseconds: created), revision: UInt64(rev), isPaused: r.text(row, 5) == "t")
        s.pausedNote = r.text(row, 6)
        s.lastNominal = int(7).map(Timestamp.init(nanoseconds:))
        switch (int(8), int(9)) {
        case (nil, nil): break
        case let (n?, op?):
            guard op > 0 else { throw fail("last_run_operation", "is \(op)") }
            s.lastRun = (Timestamp(nanoseconds: n), OperationID(raw: UInt64(op)))
        default: throw fail("last_run_nominal", "and last_run_operation are not both set or both NULL")
        }
        guard let runs = int(10), let skipped = int(11), let missed = int(12), runs >= 0, skipped >= 0, missed >= 0 else {
            throw fail("runs", "or skipped or missed is not a count")
        }
        s.runs = UInt64(runs)
        s.skipped = UInt64(skipped)
        s.missed = UInt64(missed)
        return s
    }

    /// The whole stored status: settings, revision, the generation that made it, and the counts
    /// and `operationCount` the owner had at that revision (the loader recounts them from the
    /// operations; a follower answers them as they are).
    static func queue(_ r: PGResult, _ row: Int) throws(DecodeFailure) -> QueueSnapshot {
        guard let name = r.text(row, 0) else { throw DecodeFailure(detail: "queues row with a NULL name") }
        func fail(_ column: String, _ index: Int) -> DecodeFailure {
            DecodeFailure(detail: "queues row \(name): column \(column) is \(r.text(row, index) ?? "NULL")")
        }
        guard let m = r.int64(row, 1), let maxConcurrent = Int(exactly: m), maxConcurrent == -1 || (1...Int(Int32.max)).contains(maxConcurrent) else {
            throw fail("max_concurrent", 1)
        }
        guard let e = r.int64(row, 2), let effective = Int(exactly: e) else { throw fail("effective_max", 2) }
        guard let suspended = r.bool(row, 3) else { throw fail("is_suspended", 3) }
        guard let rv = r.int64(row, 4), let revision = UInt64(exactly: rv), revision <= RecordLimits.maxCounter else { throw fail("revision", 4) }
        guard let created = r.int64(row, 5) else { throw fail("created_at", 5) }
        guard let g = r.int64(row, 6), let generation = UInt64(exactly: g), generation <= RecordLimits.maxCounter else {
            throw fail("generation", 6)
        }
        func count(_ column: String, _ index: Int) throws(DecodeFailure) -> Int {
            guard let n = r.int64(row, index), n >= 0, let v = Int(exactly: n) else { throw fail(column, index) }
            return v
        }
        let operationCount = try count("operation_count", 7)
        var counts: [OperationState: Int] = [:]
        for (i, s) in OperationState.allCases.enumerated() { counts[s] = try count("count_\(s.rawValue)", 8 + i) }
        let rate: RateLimit?
        do throws(FlowText.Refusal) { rate = try Self.rate(r, row, 13) } catch {
            throw DecodeFailure(detail: "queues row \(name): column \(error.rateColumn) \(error.why)")
        }
        let weights: [String: Int]
        do throws(FlowText.Refusal) { weights = try FlowText.weights(r.withBytes(row, 15) { Array($0) }) } catch {
            throw DecodeFailure(detail: "queues row \(name): column fairness_weights \(error.why)")
        }
        return QueueSnapshot(
            name: name, maxConcurrentOperationCount: maxConcurrent, effectiveMaxConcurrentOperationCount: effective,
            isSuspended: suspended, operationCount: operationCount, counts: counts, revision: revision,
            createdAt: Timestamp(nanoseconds: created), generation: generation, rateLimit: rate, fairnessWeights: weights)
    }

    /// Its settings, in `PGSchema.limiterColumns` order; `running`, `waiting` and `keys` are the
    /// engine's to count (0 here).
    static func host(_ r: PGResult, _ row: Int) throws(DecodeFailure) -> HostSnapshot {
        let name = r.text(row, 0)
        func int(_ c: Int) -> Int64? { r.isNull(row, c) ? nil : r.int64(row, c) }
        let values = HostText.Row(
            host: name, state: r.text(row, 1), consecutiveFailures: int(2) ?? -1, openedAt: int(3), until: int(4), throttledUntil: int(5),
            lastError: r.withBytes(row, 6) { Array($0) }, manualBreaker: r.text(row, 7), manualUntil: int(8), manualReason: r.text(row, 9),
            reopenings: int(10) ?? -1, revision: int(11) ?? -1)
        do throws(HostText.Refusal) { return try HostText.decode(values) } catch {
            throw DecodeFailure(detail: "hosts row \((name ?? "NULL").debugDescription): column \(error.column) \(error.why)")
        }
    }

    static func limiter(_ r: PGResult, _ row: Int) throws(DecodeFailure) -> LimiterSnapshot {
        guard let name = r.text(row, 0) else { throw DecodeFailure(detail: "limiters row with a NULL name") }
        func fail(_ column: String, _ why: String) -> DecodeFailure {
            DecodeFailure(detail: "limiters row \(name.debugDescription): column \(column) \(why)")
        }
        guard FlowText.isName(name) else { throw fail("name", "is not a limiter name") }
        var settings = LimiterSettings()
        if !r.isNull(row, 1) {
            do throws(FlowText.Refusal) {
                guard let n = r.int64(row, 1) else { throw FlowText.Refusal("is not an integer") }
                settings.concurrency = try FlowText.concurrency(n)
            } catch {
                throw fail("concurrency", error.why)
            }
        }
        do throws(FlowText.Refusal) { settings.rate = try Self.rate(r, row, 2) } catch { throw fail(error.rateColumn, error.why) }
        guard settings.concurrency != nil || settings.rate != nil else { throw fail("concurrency", "and the rate are both NULL") }
        do throws(FlowText.Refusal) { settings.overrides = try FlowText.overrides(r.withBytes(row, 4) { Array($0) }) } catch {
            throw fail("overrides", error.why)
        }
        guard let created = r.int64(row, 5) else { throw fail("created_at", "is not a time") }
        guard let rv = r.int64(row, 6), let revision = UInt64(exactly: rv), revision <= RecordLimits.maxCounter else {
            throw fail("revision", "is \(r.text(row, 6) ?? "NULL")")
        }
        return LimiterSnapshot(name: name, settings: settings, createdAt: Timestamp(nanoseconds: created), revision: revision)
    }

    /// A rate in columns `column` (per second) and `column + 1` (burst).
    private static func rate(_ r: PGResult, _ row: Int, _ column: Int) throws(FlowText.Refusal) -> RateLimit? {
        var perSecond: Double?
        var burst: Int64?
        if !r.isNull(row, column) {
            guard let p = r.double(row, column) else { throw FlowText.Refusal("is not a number") }
            perSecond = p
        }
        if !r.isNull(row, column + 1) {
            guard let b = r.int64(row, column + 1) else { throw FlowText.Refusal("is not an integer", inBurst: true) }
            burst = b
        }
        return try FlowText.rate(perSecond: perSecond, burst: burst)
    }

    /// The seq of an events row (column 0), if it is one opqd could have written.
    static func seq(_ r: PGResult, _ row: Int) -> UInt64? {
        guard let s = r.int64(row, 0), let seq = UInt64(exactly: s), seq > 0, seq <= RecordLimits.maxCounter else { return nil }
        return seq
    }

    static func event(_ r: PGResult, _ row: Int) throws(DecodeFailure) -> ChangeEvent {
        func fail(_ column: String) -> DecodeFailure { DecodeFailure(detail: "events row \(r.text(row, 0) ?? "?"): column \(column) is not valid") }
        guard let seq = seq(r, row) else { throw fail("seq") }
        guard let time = r.int64(row, 1) else { throw fail("time") }
        guard let queue = r.text(row, 2) else { throw fail("queue") }
        guard let o = r.int64(row, 3), let operation = UInt64(exactly: o) else { throw fail("operation") }
        guard let k = r.text(row, 4), let key = ChangeKey(rawValue: k) else { throw fail("key") }
        guard let old = change(r, row, 5) else { throw fail("old") }
        guard let new = change(r, row, 6) else { throw fail("new") }
        guard let s = r.text(row, 7), let state = OperationState(rawValue: s) else { throw fail("state") }
        return ChangeEvent(
            seq: seq, time: Timestamp(nanoseconds: time), queue: queue, operation: OperationID(raw: operation),
            key: key, old: old, new: new, state: state)
    }

    static func idempotency(_ r: PGResult, _ row: Int) throws(DecodeFailure) -> IdempotencyRecord {
        guard let scopeBytes = r.bytea(row, 0) else { throw DecodeFailure(detail: "idempotency row with an unreadable scope") }
        let scope = String(decoding: scopeBytes, as: UTF8.self)
        func fail(_ column: String) -> DecodeFailure { DecodeFailure(detail: "idempotency row \(scope.debugDescription): column \(column) is not valid") }
        guard let hash = r.text(row, 1) else { throw fail("body_hash") }
        guard let s = r.int64(row, 2), let status = Int(exactly: s), (100...599).contains(status) else { throw fail("status") }
        var headers: [(String, String)] = []
        guard let h = try json(r, row, 3, fail("headers")), case let .array(pairs) = h else { throw fail("headers") }
        for p in pairs {
            guard case let .array(nv) = p, nv.count == 2, case let .string(n) = nv[0], case let .string(v) = nv[1] else { throw fail("headers") }
            headers.append((n, v))
        }
        guard let body = r.bytea(row, 4) else { throw fail("body") }
        guard let created = r.int64(row, 5) else { throw fail("created_at") }
        return IdempotencyRecord(scope: scope, bodyHash: hash, status: status, headers: headers, body: body, createdAt: Timestamp(nanoseconds: created))
    }

    private static func time(_ r: PGResult, _ row: Int, _ column: Int, _ failure: @autoclosure () -> DecodeFailure) throws(DecodeFailure) -> Timestamp? {
        if r.isNull(row, column) { return nil }
        guard let n = r.int64(row, column) else { throw failure() }
        return Timestamp(nanoseconds: n)
    }

    private static func json(_ r: PGResult, _ row: Int, _ column: Int, _ failure: @autoclosure () -> DecodeFailure) throws(DecodeFailure) -> JSONValue? {
        guard let bytes = r.withBytes(row, column, { Array($0) }) else { return nil }
        do { return try JSONValue.parse(bytes) } catch { throw failure() }
    }

    private static func change(_ r: PGResult, _ row: Int, _ column: Int) -> ChangeValue? {
        if r.isNull(row, column) { return ChangeValue.none }
        return r.withBytes(row, column) { ChangeText.decode($0) } ?? nil
    }

    /// A `bigint[]` in text form, `{1,22,333}`, as ids (a negative one is refused).
    static func idArray(_ b: UnsafeRawBufferPointer) -> [OperationID]? {
        guard b.count >= 2, b[0] == UInt8(ascii: "{"), b[b.count - 1] == UInt8(ascii: "}") else { return nil }
        var out: [OperationID] = []
        if b.count == 2 { return out }
        var v: UInt64 = 0
        var digits = 0
        for i in 1..<b.count {
            let c = b[i]
            if c >= 48 && c <= 57 {
                let (m, o1) = v.multipliedReportingOverflow(by: 10)
                let (s, o2) = m.addingReportingOverflow(UInt64(c - 48))
                if o1 || o2 { return nil }
                v = s
                digits += 1
            } else if c == UInt8(ascii: ",") || (c == UInt8(ascii: "}") && i == b.count - 1) {
                guard digits > 0 else { return nil }
                out.append(OperationID(raw: v))
                v = 0
                digits = 0
            } else {
                return nil
            }
        }
        return out
    }
}
