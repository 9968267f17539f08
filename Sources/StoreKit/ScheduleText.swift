import QueueEngine
import Schedules

/// A schedule's settings as both stores keep them: one JSON column,
/// `{"cron"|"every", "timezone", "operation": {...}, "overlap", "catchup": {...}, "jitter", "startAt"?, "endAt"?}`
/// (times in ns). Reading refuses what the engine never writes, with the reason.
package enum ScheduleText {
    package struct Refusal: Error {
        package let why: String
        init(_ why: String) { self.why = why }
    }

    package static func write(_ s: ScheduleSpec) -> [UInt8] {
        var members: [(String, JSONValue)] = []
        switch s.rule {
        case let .cron(text): members.append(("cron", .string(text)))
        case let .every(seconds): members.append(("every", .number(Double(seconds))))
        }
        members.append(("timezone", .string(s.timezone)))
        let t = s.template
        var op: [(String, JSONValue)] = [("kind", .string(t.kind)), ("queuePriority", .string(t.queuePriority.name))]
        if let n = t.name { op.append(("name", .string(n))) }
        if let spec = t.spec { op.append(("spec", spec)) }
        if let timeout = t.options.timeout { op.append(("timeout", .number(timeout))) }
        if let r = t.options.retry {
            op.append(
                ("retry", .object([("maxAttempts", .number(Double(r.maxAttempts))), ("backoff", .number(r.backoff)), ("multiplier", .number(r.multiplier))])))
        }
        if !t.options.limits.isEmpty {
            op.append(("limits", .array(t.options.limits.map { .object([("limiter", .string($0.limiter)), ("key", .string($0.key))]) })))
        }
        if let f = t.options.fairnessKey { op.append(("fairnessKey", .string(f))) }
        if let a = t.admission { op.append(("admission", a.json)) }
        members.append(("operation", .object(op)))
        members.append(("overlap", .string(s.overlap.rawValue)))
        members.append(
            (
                "catchup",
                .object([
                    ("policy", .string(s.catchup.policy.rawValue)), ("window", .number(Double(s.catchup.window))),
                    ("maxRuns", .number(Double(s.catchup.maxRuns))),
                ])
            ))
        members.append(("jitter", .number(s.jitter)))
        // Milliseconds: a JSON number holds them exactly (nanoseconds need more than 53 bits).
        if let a = s.startAt { members.append(("startAt", .number(Double(a.nanoseconds / 1_000_000)))) }
        if let b = s.endAt { members.append(("endAt", .number(Double(b.nanoseconds / 1_000_000)))) }
        var out: [UInt8] = []
        JSONValue.object(members).write(to: &out)
        return out
    }

    package static func read(name: String, _ bytes: [UInt8]?) throws(Refusal) -> ScheduleSpec {
        guard let bytes, let v = try? JSONValue.parse(bytes), case .object = v else { throw Refusal("is not a JSON object") }
        func int(_ x: JSONValue?) -> Int64? {
            guard case let .number(n)? = x, n.isFinite, n == n.rounded(), abs(n) < 9e18 else { return nil }
            return Int64(exactly: n)
        }
        let rule: ScheduleSpec.Rule
        if case let .string(c)? = v["cron"] {
            rule = .cron(c)
        } else if let e = int(v["every"]), Timing.everyRange.contains(e) {
            rule = .every(e)
        } else {
            throw Refusal("has neither a cron nor an every")
        }
        guard case let .string(zone)? = v["timezone"], Zone.isName(zone) else { throw Refusal("has no valid timezone") }
        guard case .object? = v["operation"], let o = v["operation"], case let .string(kind)? = o["kind"] else {
            throw Refusal("has no operation kind")
        }
        var t = OperationRequest(kind: kind)
        if case let .string(p)? = o["queuePriority"], let prio = QueuePriority(name: p) {
            t.queuePriority = prio
        } else {
            throw Refusal("has no valid operation.queuePriority")
        }
        if case let .string(n)? = o["name"] { t.name = n }
        t.spec = o["spec"]
        if let timeout = o["timeout"] {
            guard case let .number(x) = timeout, x.isFinite, x > 0 else { throw Refusal("has an invalid operation.timeout") }
            t.options.timeout = x
        }
        if let r = o["retry"] {
            guard let m = int(r["maxAttempts"]), m >= 1, m <= 1_000_000, case let .number(b)? = r["backoff"], b.isFinite, b >= 0,
                case let .number(mult)? = r["multiplier"], mult.isFinite, mult >= 1
            else { throw Refusal("has an invalid operation.retry") }
            t.options.retry = RetryPolicy(maxAttempts: Int(m), backoff: b, multiplier: mult)
        }
        if case let .array(items)? = o["limits"] {
            for item in items {
                guard case let .string(l)? = item["limiter"], case let .string(k)? = item["key"] else { throw Refusal("has an invalid operation.limits") }
                t.options.limits.append(LimitRef(limiter: l, key: k))
            }
        }
        if case let .string(f)? = o["fairnessKey"] { t.options.fairnessKey = f }
        if let a = o["admission"] {
            guard let admission = Admission(json: a) else { throw Refusal("has an invalid operation.admission") }
            t.admission = admission
        }
        guard case let .string(ov)? = v["overlap"], let overlap = Overlap(rawValue: ov) else { throw Refusal("has no valid overlap") }
        guard let c = v["catchup"], case let .string(cp)? = c["policy"], let policy = Catchup.Policy(rawValue: cp), let w = int(c["window"]),
            Catchup.windowRange.contains(w), let mr = int(c["maxRuns"]), Catchup.maxRunsRange.contains(Int(mr))
        else { throw Refusal("has no valid catchup") }
        guard case let .number(jitter)? = v["jitter"], ScheduleSpec.jitterRange.contains(jitter) else { throw Refusal("has no valid jitter") }
        var spec = ScheduleSpec(
            name: name, rule: rule, timezone: zone, template: t, overlap: overlap, catchup: Catchup(policy: policy, window: w, maxRuns: Int(mr)),
            jitter: jitter)
        if let a = v["startAt"] {
            guard let n = int(a) else { throw Refusal("has an invalid startAt") }
            spec.startAt = Timestamp(nanoseconds: n &* 1_000_000)
        }
        if let b = v["endAt"] {
            guard let n = int(b) else { throw Refusal("has an invalid endAt") }
            spec.endAt = Timestamp(nanoseconds: n &* 1_000_000)
        }
        return spec
    }
}
