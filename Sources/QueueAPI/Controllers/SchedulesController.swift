import MicroHTTP
import QueueEngine
import Schedules

/// `/v1/queues/{name}/schedules` and `/v1/schedules` (API.md "Schedules"): operations created
/// on a schedule. Changes are acknowledged once durable.
package struct SchedulesController: CreateBodyParsing {
    package let engine: QueueEngine
    let durability: Durability
    package let limits: APILimits

    static let createFields = ["name", "cron", "every", "timezone", "operation", "overlap", "catchup", "jitter", "startAt", "endAt", "isPaused"]
    static let templateFields = ["kind", "name", "queuePriority", "spec", "timeout", "retry", "limits", "fairnessKey", "admission"]

    package func addRoutes(to r: inout Router) {
        let base = "/v1/queues/{name}/schedules"
        r.add("POST", base, scope: .queue(param: 0)) { req, p in try durability.idempotent(req) { try create(req, p[0]) } }
        r.add("GET", base, scope: .queue(param: 0)) { req, p in try list(req, p[0]) }
        r.add("GET", base + "/{schedule}", scope: .queue(param: 0)) { req, p in try get(req, p[0], p[1]) }
        r.add("PATCH", base + "/{schedule}", scope: .queue(param: 0)) { req, p in try patch(req, p[0], p[1]) }
        r.add("DELETE", base + "/{schedule}", scope: .queue(param: 0)) { req, p in try delete(req, p[0], p[1]) }
        r.add("GET", base + "/{schedule}/next", scope: .queue(param: 0)) { req, p in try next(req, p[0], p[1]) }
        r.add("POST", base + "/{schedule}/pause", scope: .queue(param: 0)) { req, p in try pause(req, p[0], p[1]) }
        r.add("POST", base + "/{schedule}/resume", scope: .queue(param: 0)) { req, p in try resume(req, p[0], p[1]) }
        r.add("POST", base + "/{schedule}/trigger", scope: .queue(param: 0)) { req, p in try durability.idempotent(req) { try trigger(req, p[0], p[1]) } }
        r.add("POST", base + "/{schedule}/backfill", scope: .queue(param: 0)) { req, p in
            try durability.idempotent(req) { try backfill(req, p[0], p[1]) }
        }
        r.add("GET", "/v1/schedules", scope: .everyInstance(merge: { Self.merge($0) })) { req, _ in try all(req) }
    }

    static func etag(_ s: ScheduleSnapshot) -> String { "\"s\(ETag.bootNonce)-\(s.createdAt.nanoseconds)-\(s.revision)\"" }

    // MARK: - handlers

    func create(_ req: HTTPRequest, _ queue: String) throws -> HTTPResponse {
        _ = try Query(req, allowed: [])
        let b = try Body(req, allowed: Self.createFields)
        guard let name = try b.string("name", maxLength: 1000) else { throw Problem.invalid("name", "is required: [A-Za-z0-9._-]{1,64}") }
        var spec = ScheduleSpec(name: name, rule: .every(1), template: OperationRequest(kind: ""))
        try apply(b, to: &spec, creating: true)
        let paused = try b.bool("isPaused") ?? false
        let s = try engine.createSchedule(in: queue, spec, paused: paused)
        return json(201, write(s), [("Location", "/v1/queues/\(queue)/schedules/\(name)"), ("ETag", Self.etag(s))])
    }

    func list(_ req: HTTPRequest, _ queue: String) throws -> HTTPHandlerResult {
        _ = try Query(req, allowed: [])
        let all = try engine.schedules(in: queue)
        var o = JSONOut(capacity: 512 * all.count + 32)
        o.open(); o.key("schedules"); o.openArray()
        for s in all { o.raw(write(s)) }
        o.closeArray(); o.close()
        return .response(json(200, o.bytes))
    }

    func get(_ req: HTTPRequest, _ queue: String, _ name: String) throws -> HTTPHandlerResult {
        _ = try Query(req, allowed: [])
        let s = try engine.schedule(in: queue, named: name)
        let etag = Self.etag(s)
        if ETag.matches(req, etag) { return ETag.notModified(etag) }
        return .response(json(200, write(s), [("ETag", etag)]))
    }

    func patch(_ req: HTTPRequest, _ queue: String, _ name: String) throws -> HTTPHandlerResult {
        _ = try Query(req, allowed: [])
        let b = try Body(req, allowed: Self.createFields.filter { $0 != "name" && $0 != "isPaused" })
        var spec = try engine.schedule(in: queue, named: name).spec
        try apply(b, to: &spec, creating: false)
        let s = try engine.updateSchedule(in: queue, spec)
        return durability.ack(json(200, write(s), [("ETag", Self.etag(s))]))
    }

    func delete(_ req: HTTPRequest, _ queue: String, _ name: String) throws -> HTTPHandlerResult {
        _ = try Query(req, allowed: [])
        try engine.deleteSchedule(in: queue, named: name)
        return durability.ack(HTTPResponse(status: 204))
    }

    func next(_ req: HTTPRequest, _ queue: String, _ name: String) throws -> HTTPHandlerResult {
        let q = try Query(req, allowed: ["count"])
        let count = try q.int("count", in: 1...100) ?? 10
        let (runs, _) = try engine.nextRuns(in: queue, named: name, count: count)
        var o = JSONOut(capacity: 96 * runs.count + 16)
        o.open(); o.key("runs"); o.openArray()
        for r in runs {
            o.open()
            o.key("nominalTime"); o.time(r.nominalTime)
            o.key("localTime"); o.string(Self.localTime(r.nominalTime, offset: r.offset))
            if let note = r.note { o.key("note"); o.string(note.rawValue) }
            o.close()
        }
        o.closeArray(); o.close()
        return .response(json(200, o.bytes))
    }

    func pause(_ req: HTTPRequest, _ queue: String, _ name: String) throws -> HTTPHandlerResult {
        _ = try Query(req, allowed: [])
        let b = try Body(req, allowed: ["note"], emptyIsObject: true)
        let s = try engine.pauseSchedule(in: queue, named: name, note: try b.string("note", maxLength: 512))
        return durability.ack(json(200, write(s), [("ETag", Self.etag(s))]))
    }

    func resume(_ req: HTTPRequest, _ queue: String, _ name: String) throws -> HTTPHandlerResult {
        _ = try Query(req, allowed: [])
        _ = try Body(req, allowed: [], emptyIsObject: true)
        let s = try engine.resumeSchedule(in: queue, named: name)
        return durability.ack(json(200, write(s), [("ETag", Self.etag(s))]))
    }

    func trigger(_ req: HTTPRequest, _ queue: String, _ name: String) throws -> HTTPResponse {
        _ = try Query(req, allowed: [])
        let b = try Body(req, allowed: ["overlap"], emptyIsObject: true)
        let overlap = try b["overlap"].map { v throws(Problem) in try Self.overlap(v) }
        guard let made = try engine.triggerScheduleAdmitted(in: queue, named: name, overlap: overlap) else {
            let s = try engine.schedule(in: queue, named: name)
            var o = JSONOut(capacity: 600)
            o.open()
            o.key("admission"); o.string("skipped")
            o.key("schedule"); o.raw(write(s))
            o.close()
            return json(200, o.bytes, [("Location", "/v1/queues/\(queue)/schedules/\(name)")])
        }
        var o = JSONOut(capacity: 800)
        made.operation.write(to: &o, admission: made.outcome)
        return json(made.outcome == .created ? 201 : 200, o.bytes, [("Location", "/v1/operations/\(made.operation.id)")])
    }

    func backfill(_ req: HTTPRequest, _ queue: String, _ name: String) throws -> HTTPResponse {
        _ = try Query(req, allowed: [])
        let b = try Body(req, allowed: ["from", "to", "overlap"])
        guard let f = b["from"] else { throw Problem.invalid("from", "is required: an RFC 3339 time") }
        guard let t = b["to"] else { throw Problem.invalid("to", "is required: an RFC 3339 time after from") }
        let from = try parseTime(f, field: "from")
        let to = try parseTime(t, field: "to")
        let overlap = try b["overlap"].map { v throws(Problem) in try Self.overlap(v) } ?? .bufferAll
        let ops = try engine.backfillSchedule(in: queue, named: name, from: from, to: to, overlap: overlap)
        var o = JSONOut(capacity: 600 * ops.count + 32)
        o.open(); o.key("operations"); o.openArray()
        for op in ops { op.write(to: &o) }
        o.closeArray(); o.close()
        return json(201, o.bytes)
    }

    /// Every queue's schedules this instance holds, sorted by queue and name, a page at a time.
    func all(_ req: HTTPRequest) throws -> HTTPHandlerResult {
        let q = try Query(req, allowed: ["after", "limit"])
        let limit = try q.int("limit", in: 1...1000) ?? 1000
        let after = q.values["after"]
        if let a = after, a.utf8.count > 200 { throw Problem.invalid("after", "must be the next of a previous page (queue/name, at most 200 bytes)") }
        let list = engine.allSchedules().filter { s in after.map { "\(s.queue)/\(s.spec.name)" > $0 } ?? true }
        var o = JSONOut(capacity: 4096)
        o.open(); o.key("schedules"); o.openArray()
        for s in list.prefix(limit) { o.raw(write(s)) }
        o.closeArray()
        o.key("next")
        if list.count > limit, let last = list.prefix(limit).last { o.string("\(last.queue)/\(last.spec.name)") } else { o.null() }
        o.close()
        return .response(json(200, o.bytes))
    }

    /// The pages of every instance as one: sorted by queue and name, up to the smallest `next`.
    static func merge(_ pages: [HTTPResponse]) -> HTTPResponse? {
        var items: [(String, JSONValue)] = []
        var limit: String?
        for page in pages {
            guard page.status == 200, let top = try? JSONValue.parse(page.body), case let .array(list)? = top["schedules"] else { return nil }
            if case let .string(n)? = top["next"] { limit = min(limit ?? n, n) }
            for s in list {
                guard case let .string(q)? = s["queue"], case let .string(n)? = s["name"] else { return nil }
                items.append(("\(q)/\(n)", s))
            }
        }
        items.sort { $0.0 < $1.0 }
        if let limit { items = items.filter { $0.0 <= limit } }
        var o = JSONOut(capacity: 4096)
        o.open(); o.key("schedules"); o.openArray()
        for (_, s) in items { o.value(s) }
        o.closeArray()
        o.key("next")
        if let limit { o.string(limit) } else { o.null() }
        o.close()
        return HTTPResponse(status: 200, headers: [("Content-Type", "application/json; charset=utf-8")], body: o.bytes)
    }

    // MARK: - reading a body

    private func apply(_ b: Body, to spec: inout ScheduleSpec, creating: Bool) throws {
        let cron = try b.string("cron", maxLength: 256)
        let every = try b.int("every", in: 1...Int(Timing.everyRange.upperBound), what: "whole seconds from 1 to \(Timing.everyRange.upperBound)")
        switch (cron, every) {
        case (_?, _?): throw Problem.invalid("every", "a schedule has a cron or an every, not both")
        case let (c?, nil): spec.rule = .cron(c)
        case let (nil, e?): spec.rule = .every(Int64(e))
        case (nil, nil): if creating { throw Problem.invalid("cron", "is required, or every: a cron expression, or seconds between runs") }
        }
        if let tz = try b.string("timezone", maxLength: 64) { spec.timezone = tz }
        if let t = b["operation"] {
            do {
                let tb = try Body(t, field: "operation", allowed: Self.templateFields)
                spec.template = try parseRequest(tb)
            } catch var p as Problem {
                if p.status == 422 && !p.detail.hasPrefix("operation") { p.detail = "operation.\(p.detail)" }
                throw p
            }
        } else if creating {
            throw Problem.invalid("operation", "is required: the create body of every run (kind, spec, …)")
        }
        if let v = b["overlap"] { spec.overlap = try Self.overlap(v) }
        if let c = b["catchup"] { spec.catchup = try Self.catchup(c) }
        if let j = try b.number("jitter", in: ScheduleSpec.jitterRange, what: "seconds from 0 to 3600") { spec.jitter = j }
        if let a = b["startAt"] { spec.startAt = a == .null ? nil : try parseTime(a, field: "startAt") }
        if let e = b["endAt"] { spec.endAt = e == .null ? nil : try parseTime(e, field: "endAt") }
    }

    static func overlap(_ v: JSONValue) throws(Problem) -> Overlap {
        guard case let .string(s) = v, let o = Overlap(rawValue: s) else {
            throw Problem.invalid("overlap", "must be one of \(Overlap.allCases.map(\.rawValue).joined(separator: ", ")); got \(v.text)")
        }
        return o
    }

    static func catchup(_ v: JSONValue) throws(Problem) -> Catchup {
        let b = try Body(v, field: "catchup", allowed: ["policy", "window", "maxRuns"])
        var c = Catchup()
        if let p = b["policy"] {
            guard case let .string(s) = p, let policy = Catchup.Policy(rawValue: s) else {
                throw Problem.invalid("catchup.policy", "must be one of skip, latest, all; got \(p.text)")
            }
            c.policy = policy
        }
        let w = Catchup.windowRange
        do {
            if let window = try b.int("window", in: Int(w.lowerBound)...Int(w.upperBound), what: "seconds from 1 to \(w.upperBound)") {
                c.window = Int64(window)
            }
            if let m = try b.int("maxRuns", in: Catchup.maxRunsRange, what: "an integer from 1 to 1000") { c.maxRuns = m }
        } catch {
            var p = error
            p.detail = "catchup.\(p.detail)"
            throw p
        }
        return c
    }

    // MARK: - writing

    /// A wall clock with its offset: `2026-03-29T03:00:00+02:00`.
    static func localTime(_ t: Timestamp, offset: Int32) -> String {
        let local = t.nanoseconds / 1_000_000_000 + Int64(offset)
        var o = JSONOut(capacity: 40)
        o.time(Timestamp(nanoseconds: local &* 1_000_000_000))
        // `"2026-03-29T03:00:00.000Z"` without its quotes, milliseconds and Z.
        var text = String(decoding: o.bytes.dropFirst().dropLast(), as: UTF8.self)
        if text.hasSuffix("Z") { text.removeLast() }
        if let dot = text.lastIndex(of: ".") { text = String(text[..<dot]) }
        let sign = offset < 0 ? "-" : "+"
        let a = abs(Int(offset))
        let hh = a / 3600, mm = (a % 3600) / 60
        return text + sign + (hh < 10 ? "0" : "") + String(hh) + ":" + (mm < 10 ? "0" : "") + String(mm)
    }

    func write(_ s: ScheduleSnapshot) -> [UInt8] {
        var o = JSONOut(capacity: 640)
        o.open()
        o.key("name"); o.string(s.spec.name)
        o.key("queue"); o.string(s.queue)
        switch s.spec.rule {
        case let .cron(c): o.key("cron"); o.string(c)
        case let .every(e): o.key("every"); o.int(e)
        }
        o.key("timezone"); o.string(s.spec.timezone)
        o.key("operation"); Self.writeTemplate(s.spec.template, to: &o)
        o.key("overlap"); o.string(s.spec.overlap.rawValue)
        o.key("catchup"); o.open()
        o.key("policy"); o.string(s.spec.catchup.policy.rawValue)
        o.key("window"); o.int(s.spec.catchup.window)
        o.key("maxRuns"); o.int(s.spec.catchup.maxRuns)
        o.close()
        o.key("jitter"); o.number(s.spec.jitter)
        if let a = s.spec.startAt { o.key("startAt"); o.time(a) }
        if let e = s.spec.endAt { o.key("endAt"); o.time(e) }
        o.key("isPaused"); o.bool(s.isPaused)
        if let n = s.pausedNote { o.key("pausedNote"); o.string(n) }
        if let n = s.nextRunAt { o.key("nextRunAt"); o.time(n) }
        if let r = s.lastRun {
            o.key("lastRun"); o.open()
            o.key("nominalTime"); o.time(r.nominalTime)
            o.key("operation"); o.string(r.operation.description)
            if let op = try? engine.operation(r.operation) { o.key("state"); o.string(op.state.rawValue) }
            o.close()
        }
        o.key("runs"); o.int(s.runs)
        o.key("skipped"); o.int(s.skipped)
        o.key("missed"); o.int(s.missed)
        o.key("createdAt"); o.time(s.createdAt)
        o.key("revision"); o.int(s.revision)
        o.close()
        return o.bytes
    }

    static func writeTemplate(_ t: OperationRequest, to o: inout JSONOut) {
        o.open()
        o.key("kind"); o.string(t.kind)
        if let n = t.name { o.key("name"); o.string(n) }
        o.key("queuePriority"); o.string(t.queuePriority.name)
        if let s = t.spec { o.key("spec"); o.value(s) }
        if let timeout = t.options.timeout { o.key("timeout"); o.number(timeout) }
        if let r = t.options.retry {
            o.key("retry"); o.open()
            o.key("maxAttempts"); o.int(r.maxAttempts)
            o.key("backoff"); o.number(r.backoff)
            o.key("multiplier"); o.number(r.multiplier)
            o.close()
        }
        if !t.options.limits.isEmpty { o.key("limits"); o.limits(t.options.limits) }
        if let f = t.options.fairnessKey { o.key("fairnessKey"); o.string(f) }
        if let a = t.admission { o.key("admission"); o.value(a.json) }
        o.close()
    }
}
